"""One simulation run: the Stripe-compatible simulator, a frozen clock moved only by the
schedule, and the real application (webhook view through ``django.test.Client``, Celery
tasks eager in process, the acceptance service, the jobs through ``job_run``).

A run happens inside one database transaction that is rolled back at the end (unless
``keep=True``): nested acceptance transactions are allowed in it the way Django's TestCase
allows them, so every run — and every replay the shrinker tries — starts from the same
database and leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from unittest import mock

import stripe
import time_machine
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import DEFAULT_DB_ALIAS, transaction
from django.db.models import Max
from django.test import Client, TestCase, override_settings
from django.utils import timezone

from config.celery import app as celery_app
from dunning.actions import local_retry
from dunning.gates import gates_evaluate
from dunning.jobs.framework import job_run
from dunning.jobs.schedule import CATCH_UP_ORDER, JOB_CADENCE
from dunning.models import Alert, DunningCycle, DunningPolicy, OutboxMessage, PaymentAttempt, ProviderEvent
from dunning.policy.publishing import policy_publish
from dunning.states import CycleState as S
from subscriptions.models import Subscription
from subscriptions.providers.stripe_adapter import StripeProvider
from tests.verification.fake_stripe import StripeSimulator
from tests.verification.fake_stripe.api import StripeApi
from tests.verification.fake_stripe.errors import SimError
from tests.verification.simulation.auditor import Auditor, Violation
from tests.verification.simulation.schedule import (
    PLAN_OF_PRICE,
    PRICES,
    PROVIDER_PLANS,
    PROVIDER_RETRIES,
    Schedule,
    Step,
)
from tests.verification.simulation.steps import SimulatedCrash, StepHandlers
from tests.verification.simulation.transport import client_factory

EPOCH = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
WEBHOOK_SECRET = "whsec_simulation"
ACCOUNT = "acct_demo"
LEAD_USERNAME = "sim-billing-lead"
MAX_SCHEDULER_TICKS = 40  # scheduler wake-ups inside one "advance" step
ENDED_STATUSES = ("canceled", "incomplete_expired")  # a provider subscription that has ended
CANCEL_CONFIRM_WITHIN = timedelta(hours=1)  # SPEC §7: a dunning cancellation confirmed by the provider, or an alert
log = logging.getLogger(__name__)


@dataclass
class RunResult:
    schedule: Schedule
    steps_run: int
    violations: list[Violation]
    seconds: float
    gates: Any = None  # dunning.gates.GatesReport when asked for
    counters: dict[str, int] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def first(self) -> Violation | None:
        return self.violations[0] if self.violations else None


def publish_shipped_policies() -> None:
    root = Path(settings.BASE_DIR) / "dunning" / "policy" / "shipped" if hasattr(settings, "BASE_DIR") else Path(
        "dunning/policy/shipped")
    for name in ("standard-monthly", "annual-no-grace", "local-retry-monthly", "default-catch-all"):
        text = (root / f"{name}.yaml").read_text()
        identity = next(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("policy:"))
        if not DunningPolicy.objects.filter(identity=identity).exists():
            policy_publish(text=text)


def billing_lead() -> Any:
    user, _ = get_user_model().objects.get_or_create(username=LEAD_USERNAME, defaults={"is_staff": True})
    user.groups.add(Group.objects.get_or_create(name="Billing leads")[0])
    return user


class Simulation(StepHandlers):
    """Runs one schedule; ``run()`` returns a RunResult with every violation the auditor saw.

    ``http=True`` serves the simulator on loopback and lets the SDK talk HTTP to it (slower,
    closer to production); by default the SDK's client calls the simulator in process."""

    _runs = 0

    def __init__(self, schedule: Schedule, *, stop_on_violation: bool = True, keep: bool = False,
                 gates: bool = False, progress: Callable[[int, int, RunResult | None], None] | None = None,
                 stripe_timeout: float = 0.25, audit_every: int = 1, http: bool = False) -> None:
        self.http = http
        self.schedule = schedule
        self.stop_on_violation = stop_on_violation
        self.keep = keep
        self.want_gates = gates
        self.progress = progress
        self.stripe_timeout = stripe_timeout
        self.audit_every = audit_every
        self.counters: dict[str, int] = {}
        self.timings: dict[str, float] = {}

    # ---- running
    def run(self) -> RunResult:
        started = time.perf_counter()
        result = RunResult(self.schedule, 0, [], 0.0)
        with self._world() as world:
            self.world = world
            self.auditor = Auditor(self)
            self._setup()
            self.auditor.check(step_index=-1, step=None)
            result.violations.extend(self.auditor.take())
            for index, step in enumerate(self.schedule.steps):
                if result.violations and self.stop_on_violation:
                    break
                self.step_index = index
                self._execute(step)
                result.steps_run = index + 1
                if index % self.audit_every == 0 or index == len(self.schedule.steps) - 1:
                    t0 = time.perf_counter()
                    self.auditor.check(step_index=index, step=step)
                    self.timings["audit"] = self.timings.get("audit", 0.0) + time.perf_counter() - t0
                result.violations.extend(self.auditor.take())
                if self.progress:
                    self.progress(index + 1, len(self.schedule.steps), result)
            if not result.violations or not self.stop_on_violation:
                self._settle()
                self.auditor.check(step_index=result.steps_run, step=Step("final-settle"), final=True)
                result.violations.extend(self.auditor.take())
            if self.want_gates:
                result.gates = gates_evaluate(now=self.now())
        result.seconds = time.perf_counter() - started
        result.counters = dict(self.counters)
        result.timings = {k: round(v, 2) for k, v in sorted(self.timings.items(), key=lambda kv: -kv[1])}
        return result

    @contextlib.contextmanager
    def session(self) -> Iterator[Simulation]:
        """A scripted run (the named scenarios): the world and subscriptions are set up; the
        caller acts through the simulator and the engine and calls ``audit()`` after each
        action; on exit faults clear, the scheduler catches up and a final audit runs."""
        self.violations: list[Violation] = []
        with self._world() as world:
            self.world = world
            self.auditor = Auditor(self)
            self.step_index = 0
            self._setup()
            self.audit()
            yield self
            self._settle()
            self.audit(final=True)

    def audit(self, *, final: bool = False) -> list[Violation]:
        self.step_index += 1
        self.auditor.check(step_index=self.step_index, step=None, final=final)
        self.violations.extend(self.auditor.take())
        return self.violations

    def deliver(self, order: str = "created") -> None:
        self.sim.deliver_all(order, seed=1)
        self.tick()

    def cycle(self, invoice_id: str) -> Any:
        return DunningCycle.objects.select_related("invoice", "subscription", "policy", "pending_attempt").get(
            invoice__provider_invoice_id=invoice_id)

    def subscription(self, n: int = 0) -> Any:
        return Subscription.objects.get(provider_subscription_id=self.subscriptions[n])

    def failed_renewal(self, n: int = 0, decline: str = "insufficient_funds", *, deliver: bool = True) -> str:
        self.sim.set_card(self.customers[n], decline)
        invoice = self.sim.create_renewal_invoice(self.subscriptions[n])
        self.sim.provider_attempt(invoice)
        if deliver:
            self.deliver()
        return invoice

    @contextlib.contextmanager
    def _world(self) -> Iterator[dict[str, Any]]:
        with contextlib.ExitStack() as stack:
            traveller = stack.enter_context(time_machine.travel(EPOCH, tick=False))
            retry_schedule, max_attempts = PROVIDER_RETRIES[self.schedule.provider_retries]
            sim = StripeSimulator(account=ACCOUNT, webhook_secrets=[WEBHOOK_SECRET], sink=self._post,
                                  auto_deliver=False, retry_schedule=retry_schedule, max_attempts=max_attempts)
            if self.http:
                base = sim.start()
                stack.callback(sim.stop)
            else:  # in process: the SDK's HTTP client calls the simulator's API handler directly
                Simulation._runs += 1
                base = f"http://simulation-{Simulation._runs}.invalid"
                sim.renderer.hosted_base = base
                stack.enter_context(mock.patch.object(stripe, "RequestsClient", client_factory(StripeApi(sim))))
            stack.enter_context(override_settings(
                STRIPE_API_BASE=base, STRIPE_WEBHOOK_SECRETS=[WEBHOOK_SECRET], STRIPE_ACCOUNT=ACCOUNT,
                STRIPE_API_KEY="sk_test_simulation", STRIPE_TIMEOUT_SECONDS=self.stripe_timeout,
                STRIPE_API_VERSION="", DUNNING_UNKNOWN_PAYMENT_QUEUE_USER="",
                # The schedule's frozen clock is the trusted clock of a run; PostgreSQL's clock_timestamp()
                # (a policy's `clock: DATABASE`) cannot be moved by time-machine.
                DUNNING_CLOCK_OVERRIDE="APPLICATION",
                EMAIL_BACKEND="django.core.mail.backends.locmem.EmailBackend",
                ALLOWED_HOSTS=[*settings.ALLOWED_HOSTS, "testserver"],
            ))
            previous = celery_app.conf.task_always_eager, celery_app.conf.task_eager_propagates
            celery_app.conf.task_always_eager, celery_app.conf.task_eager_propagates = True, True
            stack.callback(self._restore_celery, celery_app, previous)
            for patcher in self._patches():
                stack.enter_context(patcher)
            atomic = transaction.Atomic(DEFAULT_DB_ALIAS, savepoint=True, durable=False)
            atomic._from_testcase = True  # acceptance's durable blocks nest in it, as in a TestCase
            with atomic:
                try:
                    yield {"sim": sim, "clock": traveller, "client": Client()}
                finally:
                    if not self.keep:
                        transaction.set_rollback(True)

    @staticmethod
    def _restore_celery(app: Any, previous: tuple[bool, bool]) -> None:
        app.conf.task_always_eager, app.conf.task_eager_propagates = previous

    @property
    def sim(self) -> Any:
        return self.world["sim"]

    def now(self) -> datetime:
        return timezone.now()

    def move_to(self, when: datetime) -> None:
        if when > self.now():
            self.world["clock"].move_to(when)

    def tick(self, seconds: float = 1.0) -> None:
        self.world["clock"].shift(timedelta(seconds=seconds))

    def bump(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    # ---- the app's webhook endpoint, as the provider calls it
    def _post(self, body: bytes, headers: dict[str, str]) -> int:
        t0 = time.perf_counter()
        with TestCase.captureOnCommitCallbacks(using=DEFAULT_DB_ALIAS, execute=True):
            response = self.world["client"].post("/webhooks/stripe/", data=body, content_type="application/json",
                                                 HTTP_STRIPE_SIGNATURE=headers["Stripe-Signature"])
        self.bump("webhooks_posted")
        self.timings["webhooks"] = self.timings.get("webhooks", 0.0) + time.perf_counter() - t0
        return response.status_code

    # ---- instrumentation: pay calls seen by the auditor, crash points of the local retry path
    def _patches(self) -> list[Any]:
        original_pay = StripeProvider.pay_invoice
        original_accept = local_retry._accept
        original_send = local_retry._send
        sim_self = self

        def pay_invoice(provider: Any, invoice_id: str, *, idempotency_key: str) -> Any:
            sim_self.auditor.on_pay_request(invoice_id, idempotency_key)
            return original_pay(provider, invoice_id, idempotency_key=idempotency_key)

        def accept(out: Any, cycle_pk: int, edge: str, cause: Any, now: datetime, evidence: Any = None,
                   **params: object) -> Any:
            result = original_accept(out, cycle_pk, edge, cause, now, evidence, **params)
            if edge == "prepare_retry" and result.accepted and sim_self.crash_armed == "after_prepared":
                sim_self.crash_armed = ""
                sim_self.bump("crash_after_prepared")
                raise SimulatedCrash("worker died after PREPARED was committed")
            return result

        def send(out: Any, cycle: Any, cause: Any, now: datetime, provider: Any) -> Any:
            point = sim_self.crash_armed
            if point == "after_dispatching":
                sim_self.crash_armed = ""
                sim_self.bump("crash_after_dispatching")
                raise SimulatedCrash("worker died after DISPATCHING was committed, before the call")
            if point == "after_charge":
                sim_self.crash_armed = ""
                sim_self.bump("crash_after_charge")
                with contextlib.suppress(Exception):
                    provider.pay_invoice(cycle.invoice.provider_invoice_id,
                                         idempotency_key=cycle.pending_attempt.idempotency_key)
                raise SimulatedCrash("worker died after the provider charged, before the answer was stored")
            return original_send(out, cycle, cause, now, provider)

        self.crash_armed = ""
        return [mock.patch.object(StripeProvider, "pay_invoice", pay_invoice),
                mock.patch.object(local_retry, "_accept", accept),
                mock.patch.object(local_retry, "_send", send)]

    # ---- setup
    def _setup(self) -> None:
        self.event_watermark = ProviderEvent.objects.aggregate(m=Max("pk"))["m"] or 0
        publish_shipped_policies()
        self.lead = billing_lead()
        self.outage_until: datetime | None = None
        self.outages: list[tuple[datetime, datetime]] = []
        # Stretches of simulated time the engine itself jumped over without the scheduler (an
        # "advance" out of wake-ups, a step moving the clock to a deadline): treated like outages.
        self.gaps: list[tuple[datetime, datetime]] = []
        self.last_job_run: dict[str, datetime] = {}
        self.stale_invoices: set[str] = set()
        self.customers: list[str] = []
        self.subscriptions: list[str] = []
        self.plan_of: dict[str, str] = {}
        for n, plan in enumerate(self.schedule.plans):
            customer = self.sim.create_customer(f"sim{self.schedule.seed}-{n}@example.com", card="ok")
            self.subscribe(customer, plan)
            self.tick()
        self.sim.deliver_all()
        self.tick()

    def subscribe(self, customer: str, plan: str) -> str:
        price, interval, amount = PRICES[plan]
        sub = self.sim.create_subscription(customer, price, interval, amount=amount)
        self.customers.append(customer)
        self.subscriptions.append(sub)
        self.plan_of[sub] = plan
        return sub

    def _settle(self) -> None:
        """End of schedule: faults clear, every webhook arrives, the scheduler catches up."""
        self.sim.faults.clear()
        self.crash_armed = ""
        self.outage_until = None
        self.sim.deliver_all()
        self.tick(5)
        self.run_jobs(force=True)
        self.sim.deliver_all()
        self.tick(5)
        self.run_jobs(force=True)

    # ---- helpers over the simulator's state (creation order, so replays pick the same objects)
    def invoices(self, *statuses: str, plans: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        """The run's invoices; ``plans`` by each invoice's own price (a plan change leaves earlier
        invoices on the price, and so the policy, they were issued with)."""
        return [i for i in self.sim.invoices()
                if i["subscription"] in self.plan_of and (not statuses or i["status"] in statuses)
                and (not plans or self.invoice_plan(i) in plans)]

    def invoice_plan(self, invoice: dict[str, Any]) -> str:
        return PLAN_OF_PRICE.get(invoice.get("price") or "", self.plan_of[invoice["subscription"]])

    def cycles(self, *states: str, plans: tuple[str, ...] = ()) -> list[Any]:
        qs = DunningCycle.objects.filter(subscription__provider_subscription_id__in=self.subscriptions)
        if states:
            qs = qs.filter(state__in=states)
        cycles = list(qs.select_related("invoice", "subscription", "policy", "pending_attempt").order_by("pk"))
        if plans:
            cycles = [c for c in cycles if self._cycle_plan(c) in plans]
        return cycles

    def _cycle_plan(self, cycle: Any) -> str:
        prices = cycle.invoice.price_ids or []
        return PLAN_OF_PRICE.get(prices[0] if prices else "", self.plan_of[cycle.subscription.provider_subscription_id])

    def live_subscriptions(self) -> list[str]:
        """The run's subscriptions the provider has not ended, in creation order."""
        return [s for s in self.subscriptions if self.sim.get(s)["status"] not in ENDED_STATUSES]

    # ---- scheduler
    def in_outage(self) -> bool:
        return self.outage_until is not None and self.now() < self.outage_until

    def jump_to(self, when: datetime) -> None:
        """Move the clock without the scheduler ticking in between (recorded as a gap)."""
        start = self.now()
        self.move_to(when)
        if self.now() - start > timedelta(seconds=1):
            self.gaps.append((start, self.now()))

    def scheduler_idle(self) -> list[tuple[datetime, datetime]]:
        return [*self.outages, *self.gaps]

    def scheduler_due(self, when: datetime, period: timedelta) -> datetime:
        """By when a job running every ``period`` must have acted on something due at ``when``:
        the end of the first stretch of ``period`` from ``when`` on that no injected outage or
        engine gap interrupts (an outage starting a second after the deadline counts too)."""
        moved = True
        while moved:
            moved = False
            for start, end in self.scheduler_idle():
                if start < when + period and end > when:
                    when, moved = end, True
        return when + period

    def run_jobs(self, *, force: bool = False, only: tuple[str, ...] = ()) -> None:
        if self.in_outage() and not force:
            return
        now = self.now()
        for name in only or CATCH_UP_ORDER:
            last = self.last_job_run.get(name)
            if not force and not only and last is not None and (now - last).total_seconds() < JOB_CADENCE[name]:
                continue
            self.last_job_run[name] = now
            t0 = time.perf_counter()
            try:
                job_run(name, now=now)
                self.bump(f"job:{name}")
            except SimulatedCrash:
                pass
            except Exception as exc:  # a job must never crash on evidence: report it
                self.auditor.report("JOB_CRASHED", f"{name}: {type(exc).__name__}: {exc}")
            self.timings[f"job:{name}"] = self.timings.get(f"job:{name}", 0.0) + time.perf_counter() - t0
        self.tick()

    def run_jobs_ahead(self, ahead: timedelta) -> None:
        """An operator's ``run_jobs`` now, then ``run_jobs --now <now + ahead>``: every job once,
        asked days after the trusted clock. Whatever was due now is done by the first run; the
        trusted clock refuses every step time would decide, so the second changes nothing:
        cycles, access, contracts, attempts, money, messages written and alerts stay as they were."""
        self.run_jobs(force=True)
        before = self._fingerprint()
        for name in CATCH_UP_ORDER:
            t0 = time.perf_counter()
            try:
                job_run(name, now=self.now() + ahead)
                self.bump(f"job_ahead:{name}")
            except SimulatedCrash:
                pass
            except Exception as exc:
                self.auditor.report("JOB_CRASHED", f"{name} at now + {ahead}: {type(exc).__name__}: {exc}")
            self.timings["jobs_ahead"] = self.timings.get("jobs_ahead", 0.0) + time.perf_counter() - t0
        after = self._fingerprint()
        changed = [f"{kind} {key}: {before[kind].get(key)} → {value}" for kind in after
                   for key, value in after[kind].items() if before[kind].get(key) != value]
        if changed:
            self.auditor.report("FUTURE_NOW_CHANGED_STATE", f"jobs asked at now + {ahead} changed "
                                                           f"{len(changed)} thing(s): " + "; ".join(changed[:6]))
        self.tick()

    def _fingerprint(self) -> dict[str, dict[Any, Any]]:
        """What a job run asked at a future `now` must leave alone."""
        mine = {"subscription__provider_subscription_id__in": self.subscriptions}
        return {
            "cycle": {cid: (state, generation) for cid, state, generation in DunningCycle.objects.filter(
                **mine).values_list("cycle_id", "state", "generation")},
            "subscription": {key: rest for key, *rest in Subscription.objects.filter(
                provider_subscription_id__in=self.subscriptions).values_list(
                "provider_subscription_id", "entitlement_generation", "entitlement_profile", "contract_phase",
                "contract_revision", "provider_cancel_requested_at")},
            "attempt": {key: state for key, state in PaymentAttempt.objects.filter(
                cycle__subscription__provider_subscription_id__in=self.subscriptions).values_list(
                "idempotency_key", "state")},
            "charge": {e["id"]: e["invoice"] for e in self.sim.ledger},
            # messages written (a reminder, a notice, a provider call): their delivery is not a change
            "outbox": {key: topic for key, topic in OutboxMessage.objects.filter(**mine).values_list(
                "dedupe_key", "topic")},
            "alert": {key: (kind, resolved) for key, kind, resolved in Alert.objects.filter(**mine).values_list(
                "dedupe_key", "kind", "resolved_at")},
        }

    def provider_acts(self) -> None:
        """What the provider does on its own: due smart retries of provider-authority invoices
        (each invoice's own price says whose), the period end of a subscription set to cancel
        then, and delayed webhooks whose time has come."""
        now = self.now().timestamp()
        for inv in self.invoices("open", plans=PROVIDER_PLANS):
            if inv["auto_advance"] and inv["next_payment_attempt"] and inv["next_payment_attempt"] <= now:
                self.sim.provider_attempt(inv["id"])
                self.bump("provider_retry")
        for sub_id in self.subscriptions:  # a subscription set to cancel at its period end is canceled then
            sub = self.sim.get(sub_id)
            if sub["cancel_at_period_end"] and sub["status"] not in ENDED_STATUSES and sub["current_period_end"] <= now:
                self.sim.end_period(sub_id)
                self.bump("provider_period_end")
        self.sim.deliver_due()

    def _next_due(self) -> datetime | None:
        now = self.now()
        times: list[datetime] = []
        for c in self.cycles(S.GRACE_ACTIVE, S.RETRY_SCHEDULED, S.RETRY_FAILED, S.PAYMENT_UNKNOWN,
                             S.RETRY_DISPATCHING, S.EXCEPTION_ACTIVE, S.RESTRICTED):
            if c.state in (S.GRACE_ACTIVE, S.RETRY_SCHEDULED, S.RETRY_FAILED) and c.grace_expires_at:
                times.append(c.grace_expires_at)  # grace is a deadline, whatever the retry schedule says
            if c.state == S.RETRY_SCHEDULED and c.next_attempt_at:
                local = c.policy.retry_authority == "LOCAL"
                times.append(c.next_attempt_at if local else c.next_attempt_at + timedelta(hours=1))
            elif c.state == S.PAYMENT_UNKNOWN and c.unknown_owner_id is None:
                times.append(now + timedelta(seconds=300))
            elif c.state == S.RETRY_DISPATCHING and c.pending_attempt and c.pending_attempt.dispatched_at:
                times.append(c.pending_attempt.dispatched_at + timedelta(seconds=120))
            elif c.state == S.EXCEPTION_ACTIVE and c.exception_expires_at:
                times.append(c.exception_expires_at)
            elif c.state == S.RESTRICTED and c.restricted_at:
                times.append(c.restricted_at + timedelta(days=30))
        pending = ProviderEvent.objects.filter(processed_at__isnull=True,
                                               subscription__provider_subscription_id__in=self.subscriptions)
        times += [t + timedelta(seconds=60) for t in pending.values_list("received_at", flat=True)]
        times += self._contract_due()
        for inv in self.invoices("open", plans=PROVIDER_PLANS):
            if inv["next_payment_attempt"] and inv["auto_advance"]:
                times.append(datetime.fromtimestamp(inv["next_payment_attempt"], tz=UTC))
        for sub_id in self.subscriptions:
            sub = self.sim.get(sub_id)
            if sub["cancel_at_period_end"] and sub["status"] not in ENDED_STATUSES:
                times.append(datetime.fromtimestamp(sub["current_period_end"], tz=UTC))
        with self.sim.lock:
            times += [datetime.fromtimestamp(e.due_at, tz=UTC) for e in self.sim.outbox if e.due_at > now.timestamp()]
        if self.outage_until:
            times.append(self.outage_until)
        future = [t + timedelta(seconds=1) for t in times if t + timedelta(seconds=1) > now]
        return min(future) if future else None

    def _contract_due(self) -> list[datetime]:
        """Deadlines of the contract line as the application holds it (period end of a contract
        set to cancel then, its end date, a pause's resume time) and the hour after which an
        unconfirmed provider cancellation must raise an alert."""
        times: list[datetime] = []
        rows = Subscription.objects.filter(provider_subscription_id__in=self.subscriptions).values_list(
            "cancel_at_period_end", "current_period_end", "contract_ended_at", "pause_resumes_at",
            "provider_cancel_requested_at", "provider_cancel_confirmed_at")
        for at_period_end, period_end, ended_at, resumes_at, asked, confirmed in rows:
            if at_period_end and period_end:
                times.append(period_end)
            times += [t for t in (ended_at, resumes_at) if t]
            if asked and not confirmed:
                times.append(asked + CANCEL_CONFIRM_WITHIN)
        return times

    def advance(self, seconds: float) -> None:
        target = self.now() + timedelta(seconds=seconds)
        for _ in range(MAX_SCHEDULER_TICKS):
            due = self._next_due()
            nxt = min(due, target) if due else target
            self.move_to(nxt)
            self.provider_acts()
            self.run_jobs()
            if self.now() >= target:
                return
        self.bump("scheduler_ticks_exhausted")
        self.jump_to(target)
        self.provider_acts()
        self.run_jobs()

    # ---- steps
    def _execute(self, step: Step) -> None:
        self.bump(step.kind)
        try:
            getattr(self, f"step_{step.kind}")(step)
        except SimError:  # the provider refused the action (e.g. paying a paid invoice): nothing happened
            self.bump("provider_refused")
        self.tick()
