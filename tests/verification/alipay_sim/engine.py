"""One seeded run of the real product against the Alipay simulator served over loopback HTTP.

The product's SDK calls the simulator's ``/gateway.do`` over HTTP; the simulator's notifications
go over HTTP to a loopback receiver that hands each one to the main thread, which posts its raw
body to ``/webhooks/alipay/`` (Django's test client, on-commit callbacks run) and sends the
product's own answer back, so a ``fail`` is delivered again on Alipay's schedule. The clock is
frozen and moved only by the schedule (the simulator's clock follows ``time.time()``); the
scheduler runs every job of ``dunning.jobs.schedule`` on its cadence through ``job_run``. The whole
run is one transaction rolled back at the end, as the Stripe engine does.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock

import stripe
import time_machine
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, transaction
from django.test import Client, TestCase, override_settings
from django.utils import timezone

from config.celery import app as celery_app
from dunning.gates import gates_evaluate
from dunning.jobs.framework import job_run
from dunning.jobs.schedule import CATCH_UP_ORDER, JOB_CADENCE
from dunning.models import DunningCycle, DunningPolicy
from dunning.policy.publishing import policy_publish
from subscriptions.models import AlipayAgreement, AlipayTrade, Subscription
from subscriptions.providers.alipay import billing
from subscriptions.providers.alipay.gateway import AlipayGateway
from tests.verification.alipay_sim.auditor import Auditor, Violation
from tests.verification.alipay_sim.schedule import PLAN, Schedule, Step
from tests.verification.alipay_sim.steps import StepHandlers
from tests.verification.fake_alipay import AlipaySimulator, session_keys
from tests.verification.fake_stripe import StripeSimulator
from tests.verification.fake_stripe.api import StripeApi
from tests.verification.loopback_http import LoopbackReceiver
from tests.verification.simulation.engine import billing_lead
from tests.verification.simulation.transport import client_factory

APP_ID = "2021000000000001"
EPOCH = datetime(2026, 12, 1, 1, 0, tzinfo=UTC)
POLICY = "dunning/policy/shipped/alipay-monthly.yaml"
TIMEOUT = 0.3  # ALIPAY_TIMEOUT_SECONDS; steps.HOLD (the held connection) is longer

STRIPE_BASE = "http://alipay-simulation-stripe.invalid"
MAX_TICKS = 16  # scheduler wake-ups inside one advance step
PERIOD = timedelta(days=30)


@dataclass
class RunResult:
    schedule: Schedule
    steps_run: int = 0
    violations: list[Violation] = field(default_factory=list)
    seconds: float = 0.0
    gates: Any = None
    counters: dict[str, int] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def first(self) -> Violation | None:
        return self.violations[0] if self.violations else None


@dataclass
class _Delivery:
    body: bytes
    content_type: str
    done: threading.Event = field(default_factory=threading.Event)
    answer: tuple[int, bytes] = (503, b"")


class Relay:
    """The loopback endpoint the simulator notifies. Each POST waits while the main thread (which
    holds the run's database transaction) posts the body to the product and hands back its answer."""

    def __init__(self) -> None:
        self.inbox: queue.Queue[_Delivery] = queue.Queue()
        self._endpoint = LoopbackReceiver(self._on_post, path="/notify/alipay/", thread_name="alipay-sim-relay")
        self.url = self._endpoint.url

    def _on_post(self, path: str, body: bytes, content_type: str) -> tuple[int, bytes]:
        """Hand the delivery to the thread that runs the product; send back what it answered."""
        item = _Delivery(body, content_type)
        self.inbox.put(item)
        item.done.wait(30)
        return item.answer

    def deliver_due(self, sim: AlipaySimulator, post: Callable[[bytes, str], tuple[int, bytes]]) -> int:
        """The simulator delivers what is due (in a thread); this thread answers each delivery."""
        finished = threading.Event()

        def deliver() -> None:
            try:
                sim.deliver_due()
            finally:
                finished.set()

        worker = threading.Thread(target=deliver, name="alipay-sim-deliver", daemon=True)
        worker.start()
        handled = 0
        while not (finished.is_set() and self.inbox.empty()):
            try:
                item = self.inbox.get(timeout=0.005)
            except queue.Empty:
                continue
            try:
                item.answer = post(item.body, item.content_type)
            finally:
                item.done.set()
            handled += 1
        worker.join(5)
        return handled

    def stop(self) -> None:
        self._endpoint.stop()


class AlipaySimulation(StepHandlers):
    def __init__(self, schedule: Schedule, *, gates: bool = True, stop_on_violation: bool = True,
                 patches: tuple[Any, ...] = (), progress: Callable[[int, int], None] | None = None) -> None:
        self.schedule = schedule
        self.want_gates = gates
        self.stop_on_violation = stop_on_violation
        self.extra_patches = patches
        self.progress = progress
        self.counters: dict[str, int] = {}
        self.timings: dict[str, float] = {}

    # ---- running
    def run(self) -> RunResult:
        started = time.perf_counter()
        result = RunResult(self.schedule)
        with self._world():
            self.auditor = Auditor(self)
            self._setup()
            self.auditor.check(step_index=-1, step=Step("setup"))
            result.violations += self.auditor.take()
            for index, step in enumerate(self.schedule.steps):
                if result.violations and self.stop_on_violation:
                    break
                self.step_index = index
                self.bump(step.kind)
                getattr(self, f"step_{step.kind}")(**step.args)
                self.tick()
                result.steps_run = index + 1
                t0 = time.perf_counter()
                self.auditor.check(step_index=index, step=step)
                self.timed("audit", t0)
                result.violations += self.auditor.take()
                if self.progress:
                    self.progress(index + 1, len(self.schedule.steps))
            if not result.violations or not self.stop_on_violation:
                self.step_index = len(self.schedule.steps)
                self._settle()
                self.auditor.check(step_index=self.step_index, step=Step("final-settle"), final=True)
                result.violations += self.auditor.take()
            if self.want_gates:
                result.gates = gates_evaluate(now=self.now())
        result.seconds = time.perf_counter() - started
        result.counters = dict(sorted(self.counters.items()))
        result.timings = {k: round(v, 1) for k, v in sorted(self.timings.items(), key=lambda kv: -kv[1])}
        return result

    @contextlib.contextmanager
    def _world(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            self.clock = stack.enter_context(time_machine.travel(EPOCH, tick=False))
            keys = session_keys()
            self.relay_server = Relay()
            stack.callback(self.relay_server.stop)
            self.sim = AlipaySimulator(alipay_private_pem=keys.alipay_private_pem,
                                       alipay_public_pem=keys.alipay_public_pem, notify_timeout=10.0)
            self.sim.start()
            stack.callback(self.sim.stop)
            self.sim.register_app(APP_ID, keys.app_public_pem, self.relay_server.url)
            self.keys = keys
            # The Stripe jobs run too (every job of the schedule): against an empty Stripe simulator
            # in process, never the real API.
            stripe_sim = StripeSimulator(account="acct_alipay_sim", webhook_secrets=["whsec_alipay_sim"],
                                         sink=lambda body, headers: 200, auto_deliver=False)
            stripe_sim.renderer.hosted_base = STRIPE_BASE
            stack.enter_context(mock.patch.object(stripe, "RequestsClient", client_factory(StripeApi(stripe_sim))))
            stack.enter_context(override_settings(
                STRIPE_API_BASE=STRIPE_BASE, STRIPE_WEBHOOK_SECRETS=["whsec_alipay_sim"],
                STRIPE_ACCOUNT="acct_alipay_sim",
                STRIPE_API_KEY="sk_test_alipay_sim", STRIPE_TIMEOUT_SECONDS=0.25, STRIPE_API_VERSION="",
                ALIPAY_APP_ID=APP_ID, ALIPAY_GATEWAY_URL=self.sim.gateway_url,
                ALIPAY_APP_PRIVATE_KEY=keys.app_private_pem, ALIPAY_PUBLIC_KEY=keys.alipay_public_pem,
                ALIPAY_NOTIFY_URL=self.relay_server.url, ALIPAY_TIMEOUT_SECONDS=TIMEOUT,
                DUNNING_UNKNOWN_PAYMENT_QUEUE_USER="",
                # The frozen clock is the run's trusted clock (the policy's `clock: DATABASE` cannot be moved).
                DUNNING_CLOCK_OVERRIDE="APPLICATION",
                EMAIL_BACKEND="django.core.mail.backends.locmem.EmailBackend",
                ALLOWED_HOSTS=[*settings.ALLOWED_HOSTS, "testserver"],
            ))
            previous = celery_app.conf.task_always_eager, celery_app.conf.task_eager_propagates
            celery_app.conf.task_always_eager, celery_app.conf.task_eager_propagates = True, True
            stack.callback(self._restore_celery, previous)
            for patcher in (*self._instrumentation(), *self.extra_patches):
                stack.enter_context(patcher)
            self.client = Client()
            atomic = transaction.Atomic(DEFAULT_DB_ALIAS, savepoint=True, durable=False)
            atomic._from_testcase = True  # acceptance's durable blocks nest in it, as in a TestCase
            with atomic:
                try:
                    yield
                finally:
                    transaction.set_rollback(True)

    @staticmethod
    def _restore_celery(previous: tuple[bool, bool]) -> None:
        celery_app.conf.task_always_eager, celery_app.conf.task_eager_propagates = previous

    def _instrumentation(self) -> list[Any]:
        """Every deduction and query the product sends is shown to the auditor, with its answer."""
        original_pay, original_query = AlipayGateway.trade_pay, AlipayGateway.trade_query
        run = self

        def trade_pay(gateway: AlipayGateway, out_trade_no: str, agreement_no: str, amount_fen: int,
                      subject: str) -> Any:
            run.auditor.on_pay(out_trade_no, amount_fen)
            try:
                answer = original_pay(gateway, out_trade_no, agreement_no, amount_fen, subject)
            except Exception:
                run.auditor.on_answer("pay", out_trade_no, None)
                raise
            run.auditor.on_answer("pay", out_trade_no, answer)
            return answer

        def trade_query(gateway: AlipayGateway, out_trade_no: str) -> Any:
            try:
                answer = original_query(gateway, out_trade_no)
            except Exception:
                run.auditor.on_answer("query", out_trade_no, None)
                raise
            run.auditor.on_answer("query", out_trade_no, answer)
            return answer

        return [mock.patch.object(AlipayGateway, "trade_pay", trade_pay),
                mock.patch.object(AlipayGateway, "trade_query", trade_query)]

    # ---- setup and settle
    def _setup(self) -> None:
        if not DunningPolicy.objects.filter(identity="alipay-monthly@1").exists():
            with open(POLICY) as fh:
                policy_publish(text=fh.read(), now=EPOCH - timedelta(days=60))
        billing_lead()  # someone to own an unknown payment (SPEC: within the hour)
        self.outage_until: datetime | None = None
        self.last_job_run: dict[str, datetime] = {}
        self.users: list[str] = []
        self.agreement_nos: list[str] = []
        for n, start in enumerate(self.schedule.agreements):
            began = EPOCH + timedelta(seconds=start.period_ends_in) - PERIOD
            terms = billing.agreement_begin(customer_email=f"alipay-sim{self.schedule.seed}-{n}@example.com",
                                            price_id=PLAN, app_id=APP_ID, plans=settings.ALIPAY_PLANS, now=began)
            user = self.sim.create_user(start.balance_fen)
            self.users.append(user)
            self.agreement_nos.append(self.sim.sign_agreement(APP_ID, user, terms.external_agreement_no))
            self.relay()
            self.tick()
        imported = Subscription.objects.filter(provider="alipay", provider_subscription_id__in=self.agreement_nos)
        if imported.count() != len(self.agreement_nos):
            raise AssertionError(f"{imported.count()} of {len(self.agreement_nos)} agreements imported at setup")

    def _settle(self) -> None:
        """End of schedule: faults clear, trades left waiting are settled by Alipay, the scheduler is
        back, every notification is delivered and every job runs, until nothing is in flight."""
        self.sim.faults.clear()
        self.outage_until = None
        for trade in self.sim.trade_list(APP_ID):
            if trade["trade_status"] == "WAIT_BUYER_PAY":
                self.sim.settle_trade(APP_ID, trade["out_trade_no"], success=True)
                self.bump("settled_at_end")
        for rounds in range(40):
            self.relay()
            self.run_jobs(force=True)
            self.relay()
            pending = [n for n in self.sim.notification_list() if n["pending"]]
            unanswered = AlipayTrade.objects.exclude(status__in=["TRADE_SUCCESS", "TRADE_FINISHED", "TRADE_CLOSED",
                                                                 "FAILED", "NOT_FOUND"]).exists()
            if rounds >= 2 and not pending and not unanswered:
                break
            self.move_to(self.now() + (timedelta(hours=2) if pending else timedelta(minutes=10)))
        self.run_jobs(force=True)

    # ---- clock, counters, the product's endpoint
    def now(self) -> datetime:
        return timezone.now()

    def move_to(self, when: datetime) -> None:
        if when > self.now():
            self.clock.move_to(when)

    def tick(self, seconds: float = 1.0) -> None:
        self.clock.shift(timedelta(seconds=seconds))

    def timed(self, name: str, since: float) -> None:
        self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - since

    def bump(self, name: str, by: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + by

    def post(self, body: bytes, content_type: str = "application/x-www-form-urlencoded; charset=utf-8",
             ) -> tuple[int, bytes]:
        """Post one raw notification to the product. A refused one must leave access as it was."""
        t0 = time.perf_counter()
        before = self.auditor.access()
        with TestCase.captureOnCommitCallbacks(using=DEFAULT_DB_ALIAS, execute=True):
            response = self.client.post("/webhooks/alipay/", data=body, content_type=content_type)
        self.bump("notifications_posted")
        if response.status_code != 200:
            self.bump(f"notification_answered_{response.status_code}")
            # Accepted set: nothing. A refused (rejected or quarantined) notification changes no access.
            self.auditor.unchanged_access(before, f"notification answered {response.status_code}")
        self.timed("notifications", t0)
        return response.status_code, response.content

    def relay(self) -> int:
        handled = self.relay_server.deliver_due(self.sim, self.post)
        self.bump("relayed", handled)
        return handled

    # ---- the scheduler
    def in_outage(self) -> bool:
        return self.outage_until is not None and self.now() < self.outage_until

    def run_jobs(self, *, force: bool = False, at: datetime | None = None) -> None:
        if self.in_outage() and not force:
            return
        now = at or self.now()
        for name in CATCH_UP_ORDER:
            last = self.last_job_run.get(name)
            if at is None and not force and last is not None and (now - last).total_seconds() < JOB_CADENCE[name]:
                continue
            if at is None:
                self.last_job_run[name] = now
            t0 = time.perf_counter()
            try:
                job_run(name, now=now)
                self.bump(f"job:{name}")
            except Exception as exc:  # a job must never crash on what Alipay answers: report it
                self.auditor.report("JOB_CRASHED", f"{name} at {now.isoformat()}: {type(exc).__name__}: {exc}")
            self.timed(f"job:{name}", t0)

    def _next_due(self, deliver: bool) -> datetime | None:
        """The next moment something is due: a renewal, a retry, a grace end, an unknown to ask
        about, a notification (when they flow), the end of an outage."""
        now = self.now()
        times = list(AlipayAgreement.objects.filter(agreement_no__in=self.agreement_nos, merchant_canceled_at=None)
                     .values_list("period_end", flat=True))
        for state, retry_at, grace_end, since in DunningCycle.objects.filter(
                subscription__provider_subscription_id__in=self.agreement_nos).exclude(
                state__in=["RECOVERED", "CANCELED", "CLOSED_VOID"]).values_list(
                "state", "next_attempt_at", "grace_expires_at", "unknown_since"):
            times += [t for t in (retry_at, grace_end) if t]
            # An unknown is asked about every unknown_payments period in its first hours (owner within
            # the hour); one still waiting after that (a trade Alipay keeps WAIT_BUYER_PAY) waits for
            # the other wake-ups rather than costing every advance its whole tick budget.
            if state == "PAYMENT_UNKNOWN" and (since is None or now - since < timedelta(hours=2)):
                times.append(now + timedelta(seconds=JOB_CADENCE["unknown_payments"]))
        if deliver:
            with self.sim.lock:
                times += [datetime.fromtimestamp(n.due_at, tz=UTC) for n in self.sim.notifications if n.pending]
        if self.outage_until:
            times.append(self.outage_until)
        future = [t + timedelta(seconds=1) for t in times if t + timedelta(seconds=1) > now]
        return min(future) if future else None

    def advance(self, seconds: float, deliver: bool) -> None:
        target = self.now() + timedelta(seconds=seconds)
        for _ in range(MAX_TICKS):
            due = self._next_due(deliver)
            self.move_to(min(due, target) if due else target)
            if deliver:
                self.relay()
            self.run_jobs()
            if deliver:
                self.relay()
            if self.now() >= target:
                return
        self.bump("scheduler_ticks_exhausted")
        self.move_to(target)
        self.run_jobs()
