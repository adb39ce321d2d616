"""One AgentPay simulation run: the real gateway (django.test.Client, in threads where a step is
concurrent), the real services and jobs, a loopback upstream, a frozen clock moved only by the
schedule, crashes injected after commits (`faults`), and the auditor after every step.

The run commits for real (threads need their own connections), so the caller provides an empty
database (a transactional test) and gets it back dirty; `drain` at the end retries every key
but the abandoned ones (`Schedule.abandon_every`: agents that never retry), moves the clock past
every deadline and runs the jobs, after which nothing may be left open and no hold pending.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import time_machine
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.db import connection
from django.test import Client, override_settings

from agentpay.api.auth import tenant_api_key_create
from agentpay.bridge import trusted_now
from agentpay.jobs import agentpay_job_run
from agentpay.models import PaymentIntent, PricedRoute, Transfer
from agentpay.services.recovery import review_resolve
from agentpay.services.tenants import tenant_create
from agentpay.services.topups import wallet_staff_credit
from tests.verification.agentpay_sim.auditor import Auditor, Violation
from tests.verification.agentpay_sim.faults import Crash, Faults
from tests.verification.agentpay_sim.schedule import ANSWERS, Schedule, Step
from tests.verification.agentpay_sim.upstream import SimUpstream

EPOCH = datetime(2027, 3, 1, 9, 0, tzinfo=UTC)
PRICE = 150
FENCED_ROUTES = {"ok", "bad", "sick", "drop"}  # routes whose status query fences not_found
log = logging.getLogger(__name__)


@dataclass
class RunResult:
    schedule: Schedule
    steps_run: int
    violations: list[Violation]
    seconds: float
    counters: Counter = field(default_factory=Counter)

    @property
    def ok(self) -> bool:
        return not self.violations


@dataclass
class Key:
    tenant: int
    key: str
    route: str
    body: bytes
    intents: set[str] = field(default_factory=set)
    abandoned: bool = False  # its agent never sends it again


class Simulation:
    def __init__(self, schedule: Schedule, *, drain: bool = True,
                 inject: Callable[[Simulation, int], None] | None = None) -> None:
        self.schedule, self.drain_at_end, self.inject = schedule, drain, inject
        self.faults = Faults()
        self.upstream = SimUpstream()
        self.decisions: dict[str, bool] = {}  # intent id -> a billing lead's "delivered"
        self.auditor = Auditor(seed=schedule.seed, upstream=self.upstream, decisions=self.decisions)
        self.keys: list[Key] = []
        self.counters: Counter = Counter()
        self.step_no = -1
        self._lock = threading.Lock()

    # -- world ---------------------------------------------------------------------------------
    def _setup(self) -> None:

        group, _ = Group.objects.get_or_create(name="Billing leads")
        group.permissions.add(*Permission.objects.filter(content_type__app_label="agentpay",
                                                         codename__in=["resolve_review", "credit_wallet"]))
        lead = get_user_model().objects.create_user("sim-lead", is_staff=True)
        lead.groups.add(group)
        self.lead = get_user_model().objects.get(pk=lead.pk)
        for what in ANSWERS:
            PricedRoute.objects.create(
                slug=what, name=what, upstream_base_url=self.upstream.base_url, upstream_path=f"/{what}",
                method="POST", price_minor=PRICE, currency="usd", rails_allowed=["wallet"],
                connect_timeout_seconds=1.0, read_timeout_seconds=0.25, fences_not_found=what in FENCED_ROUTES,
                status_query_url=f"{self.upstream.base_url}/status")
        self.tenants, self.api_keys = [], []
        for n, balance in enumerate(self.schedule.balances):
            tenant = tenant_create(name=f"sim tenant {n}")
            wallet_staff_credit(tenant=tenant, currency="usd", amount=balance, user=self.lead, reason="float",
                                ticket="SIM-0")
            self.tenants.append(tenant)
            self.api_keys.append(tenant_api_key_create(tenant=tenant, label="sim")[1])

    @contextlib.contextmanager
    def _world(self) -> Iterator[Any]:

        with contextlib.ExitStack() as stack:
            traveller = stack.enter_context(time_machine.travel(EPOCH, tick=False))
            stack.enter_context(override_settings(DUNNING_CLOCK_OVERRIDE="APPLICATION",
                                                  ALLOWED_HOSTS=["testserver", "localhost"]))
            self.upstream.start()
            stack.callback(self.upstream.stop)
            stack.enter_context(self.faults.installed())
            logging.disable(logging.INFO)
            stack.callback(logging.disable, logging.NOTSET)
            request_log = logging.getLogger("django.request")  # every 4xx / 502 answer is expected here
            stack.callback(request_log.setLevel, request_log.level)
            request_log.setLevel(logging.CRITICAL)
            yield traveller

    def now(self) -> datetime:

        return trusted_now()

    # -- run -----------------------------------------------------------------------------------
    def run(self) -> RunResult:
        started = time.perf_counter()
        with self._world() as clock:
            self.clock = clock
            self._setup()
            self.auditor.check(-1)
            for number, step in enumerate(self.schedule.steps):
                self.step_no = number
                self.counters[step.kind] += 1
                getattr(self, f"do_{step.kind}")(step)
                if self.inject is not None:
                    self.inject(self, self.step_no)
                self.auditor.check(self.step_no)
            if self.drain_at_end:
                self.step_no = len(self.schedule.steps)
                self.drain()
        return RunResult(self.schedule, len(self.schedule.steps), self.auditor.violations,
                         time.perf_counter() - started, self.counters)

    def flag(self, code: str, detail: str) -> None:
        self.auditor.flag(code, self.step_no, detail)

    # -- agents --------------------------------------------------------------------------------
    def _send(self, key: Key, body: bytes | None = None) -> int | None:
        """One gateway call; None when the process 'died' in it. Judges the answer."""
        client = Client()
        try:
            response = client.post(f"/agentpay/v1/routes/{key.route}/run", data=body or key.body,
                                   content_type="application/json", HTTP_IDEMPOTENCY_KEY=key.key,
                                   HTTP_AUTHORIZATION=f"Bearer {self.api_keys[key.tenant]}")
        except Crash as crash:
            with self._lock:
                self.counters[f"crash:{crash}"] += 1
            return None
        finally:
            self.faults.reset_thread()
        status = response.status_code
        with self._lock:
            self.counters[f"http:{status}"] += 1
        if status >= 500 and status not in (502, 504):
            self.flag("INTERNAL_ERROR", f"{key.key}: {status} {response.content[:200]!r}")
        intent = response.get("AgentPay-Intent") or _json(response).get("intent_id")
        if body is not None:  # a different request under a used key
            if status != 422 or not _json(response).get("type", "").endswith("/idempotency-key-reused"):
                self.flag("KEY_REUSE_ACCEPTED", f"{key.key} with another body answered {status}")
            return status
        if intent:
            with self._lock:
                key.intents.add(intent)
                if len(key.intents) > 1:
                    self.flag("KEY_ANSWERED_TWO_INTENTS", f"{key.key}: {sorted(key.intents)}")
        return status

    def _new_key(self, tenant: int, route: str) -> Key:
        n = len(self.keys)
        every = self.schedule.abandon_every
        key = Key(tenant, f"s{self.schedule.seed}-k{n}", route, json.dumps({"n": n}).encode(),
                  abandoned=bool(every) and n % every == 0)
        self.keys.append(key)
        return key

    def _threads(self, work: list[Callable[[], Any]]) -> None:
        barrier = threading.Barrier(len(work))

        def run(job: Callable[[], Any]) -> None:
            try:
                barrier.wait()
                job()
            except Exception as exc:  # noqa: BLE001 — a thread's error is a finding, not a crash of the run
                self.flag("INTERNAL_ERROR", f"thread raised {type(exc).__name__}: {exc}")
            finally:
                connection.close()

        threads = [threading.Thread(target=run, args=(job,)) for job in work]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def do_call(self, step: Step) -> None:
        self._send(self._new_key(step.a % len(self.tenants), step.what))

    def do_replay(self, step: Step) -> None:
        if self.keys and not self.keys[step.b % len(self.keys)].abandoned:
            self._send(self.keys[step.b % len(self.keys)])

    def do_reuse(self, step: Step) -> None:
        if self.keys:
            self._send(self.keys[step.b % len(self.keys)], body=b'{"other": true}')

    def do_burst(self, step: Step) -> None:
        key = self._new_key(step.a % len(self.tenants), step.what)
        self._threads([lambda: self._send(key)] * step.n)

    def do_crowd(self, step: Step) -> None:
        keys = [self._new_key(0, step.what) for _ in range(step.n)]
        self._threads([lambda k=k: self._send(k) for k in keys])

    def do_crash(self, step: Step) -> None:
        self.faults.arm(step.what)

    # -- time and jobs -------------------------------------------------------------------------
    def do_advance(self, step: Step) -> None:
        self.clock.shift(timedelta(seconds=step.n))

    def _job(self, name: str, now: datetime) -> Any:

        try:
            return agentpay_job_run(name, now=now)
        except Crash as crash:
            self.counters[f"crash:{crash}"] += 1
            return None
        finally:
            self.faults.reset_thread()

    def do_job(self, step: Step) -> None:
        self._job(step.what, self.now())

    def do_job_past(self, step: Step) -> None:
        self._job(step.what, self.now() - timedelta(seconds=step.n))

    def do_job_ahead(self, step: Step) -> None:
        self.auditor._terminal(self.step_no)  # a fresh snapshot, compared after the run
        before = dict(self.auditor.snapshots)
        run = self._job(step.what, self.now() + timedelta(hours=1))
        self.auditor._terminal(self.step_no)
        if run is not None and (run.refused != 1 or run.changed) or before != self.auditor.snapshots:
            self.flag("FUTURE_NOW_CHANGED_STATE", f"{step.what} an hour ahead: {run}")

    def do_jobs_race(self, step: Step) -> None:

        now = self.now()
        self._threads([lambda: agentpay_job_run("agentpay_fulfillment_status_query", now=now)] * 2)

    def do_status_faults(self, step: Step) -> None:
        with self.upstream.lock:
            self.upstream.status_faults += step.n

    # -- staff ---------------------------------------------------------------------------------
    def do_review(self, step: Step) -> None:

        waiting = list(PaymentIntent.objects.filter(state="needs_review").select_related("fulfillment")
                       .order_by("pk"))
        if not waiting:
            return
        intent = waiting[step.b % len(waiting)]
        ful = intent.fulfillment.fulfillment_id
        if self.upstream.in_flight(ful):
            return  # the upstream's log does not tell yet; a careful lead waits
        with self.upstream.lock:
            delivered = self.upstream.acted.get(ful) == "succeeded"
        self.decisions[intent.intent_id] = delivered
        try:
            review_resolve(intent_id=intent.intent_id, delivered=delivered, user=self.lead,
                           reason="checked the upstream's log", ticket=f"SIM-{self.step_no}")
        except Crash as crash:
            self.counters[f"crash:{crash}"] += 1
        finally:
            self.faults.reset_thread()

    def do_topup(self, step: Step) -> None:

        wallet_staff_credit(tenant=self.tenants[step.a % len(self.tenants)], currency="usd", amount=step.n,
                            user=self.lead, reason="top-up", ticket=f"SIM-{self.step_no}")

    # -- the end -------------------------------------------------------------------------------
    def drain(self) -> None:
        """Everyone but the abandoned agents retries, the clock passes every lease and deadline, the
        jobs run, leads resolve: then no intent may be left open and no hold unresolved (an
        abandoned agent's intent that was authorized but never held holds no money; it is
        counted, not flagged: nothing expires it yet)."""
        self.faults.disarm()
        with self.upstream.lock:
            self.upstream.status_faults = 0
        time.sleep(self.upstream.hang_seconds)  # hung calls finish acting
        for _ in range(2):
            self.clock.shift(timedelta(minutes=20))
            for key in self.keys:
                if not key.abandoned:
                    self._send(key)
            for name in ("agentpay_hold_expiry", "agentpay_fulfillment_status_query", "agentpay_recovery_deadline",
                         "agentpay_fulfillment_status_query"):
                self._job(name, self.now())
                self.clock.shift(timedelta(minutes=20))
            for n in range(PaymentIntent.objects.filter(state="needs_review").count()):
                self.do_review(Step("review", b=n))
            self.auditor.check(self.step_no)
        for state, fulfillment in PaymentIntent.objects.values_list("state", "fulfillment__state"):
            self.counters[f"end:{state}/{fulfillment}"] += 1
        self.counters["needs_review_reached"] = PaymentIntent.objects.filter(needs_review_at__isnull=False).count()
        abandoned = {k.key for k in self.keys if k.abandoned}
        self.counters["abandoned_keys"] = len(abandoned)
        open_intents = []
        for intent_id, key, state, settlement, fulfillment in (
                PaymentIntent.objects.exclude(state__in=["completed", "failed", "expired", "rejected"])
                .values_list("intent_id", "idempotency_key", "state", "settlements__state", "fulfillment__state")):
            if key in abandoned and (state, settlement, fulfillment) == ("authorized", "not_started", "not_started"):
                self.counters["abandoned_authorized_unheld"] += 1
                continue
            open_intents.append((intent_id, state, settlement, fulfillment))
        if open_intents:
            self.flag("STUCK_AFTER_DRAIN", f"{len(open_intents)} intents open: {open_intents[:5]}")
        self.counters["holds_expired"] = Transfer.objects.filter(kind="void_pending",
                                                                 intent__state="expired").count()
        self.auditor.check_after_deadlines(self.step_no)


def _json(response: Any) -> dict[str, Any]:
    try:
        body = json.loads(response.content)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
