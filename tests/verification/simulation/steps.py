"""The step handlers of a simulation run: one method per kind of scheduled step (customer
payments, declines, webhook disorder, lost pay answers, outages, crashes, voids, refunds,
disputes, outbox replays, stale reads, support exceptions; and the contract line: cancellations
at the provider now or at the period end, pauses, resumes, plan changes, staff cancellations,
a failing provider cancel endpoint, job runs asked at a future `now`). Mixed into
`Simulation`, whose state (simulator, clock, app client, auditor) they use."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta
from typing import Any

from dunning.acceptance.inputs import Cause, Expect
from dunning.acceptance.transitions import cycle_accept_transition
from dunning.actions.retry_now import cycle_retry_now
from dunning.jobs.messaging import CONSUMERS
from dunning.models import CauseKind, OutboxMessage
from dunning.states import EXCEPTION_SOURCE_STATES, OPEN_STATES
from dunning.states import CycleState as S
from tests.verification.simulation.schedule import DECLINES, PRICES, PROVIDER_PLANS, Step

ENDED_STATUSES = ("canceled", "incomplete_expired")
PAUSE_BEHAVIORS = ("void", "void", "keep_as_draft", "mark_uncollectible")


class SimulatedCrash(Exception):
    """A worker dies at a recovery point of the local retry path."""


def _pick(items: list, a: float):  # noqa: ANN202
    return items[min(int(a * len(items)), len(items) - 1)] if items else None


class StepHandlers:
    """Step methods; `Simulation` provides the state they act on."""

    def step_advance(self, s: Step) -> None:
        if s.b < 0.6:
            seconds = 60 + s.a * 3600
        elif s.b < 0.9:
            seconds = 3600 + s.a * 12 * 3600
        else:
            seconds = 86400 * (1 + s.a * 3)
        self.advance(seconds)

    def step_jobs(self, s: Step) -> None:
        self.run_jobs(force=True)

    def step_renewal(self, s: Step) -> None:
        self._renew(_pick(self.live_subscriptions(), s.a))

    def step_soft_decline(self, s: Step) -> None:
        """The card of a customer on a provider-retry plan starts failing with a decline the
        provider retries, and a renewal is charged on it: the run's provider schedule (Stripe's
        classic 3/5/7 days, or Smart-Retries-like, 8 tries over 14 days) then runs past the grace
        end unless the customer pays or the card works again."""
        sub = _pick([x for x in self.live_subscriptions() if self.plan_of[x] in PROVIDER_PLANS], s.a)
        if sub is None:
            return
        self.sim.set_card(self.sim.get(sub)["customer"], "insufficient_funds" if s.b < 0.8 else "processing_error")
        self._renew(sub)

    def _renew(self, sub: str | None) -> None:
        if sub is None or len(self.invoices("open", "uncollectible")) >= 2 * len(self.schedule.plans) + 1:
            return
        current = self.sim.get(sub)
        if current["status"] != "active" and current["status"] != "past_due":
            return  # trialing / paused / incomplete: no renewal charge
        if current["cancel_at_period_end"]:
            self.sim.end_period(sub)  # this period's end is the one it was set to cancel at
            self.bump("renewal_ends_contract")
            return
        invoice = self.sim.create_renewal_invoice(sub)
        if self.sim.get(invoice)["auto_advance"]:  # collection paused: the provider does not charge it
            self.sim.provider_attempt(invoice)

    def step_set_card(self, s: Step) -> None:
        customer = _pick(self.customers, s.a)
        self.sim.set_card(customer, "ok" if s.b < 0.3 else _pick(list(DECLINES), (s.b - 0.3) / 0.7))

    def step_customer_pays(self, s: Step) -> None:
        inv = _pick(self.invoices("open", "uncollectible"), s.a)
        if inv:
            self.sim.customer_pays(inv["id"])

    def step_boundary_pay(self, s: Step) -> None:
        cycle = _pick(self.cycles(S.GRACE_ACTIVE), s.a)
        if cycle is None or cycle.grace_expires_at is None or cycle.grace_expires_at <= self.now():
            return
        self.jump_to(cycle.grace_expires_at)
        self.sim.customer_pays(cycle.invoice.provider_invoice_id)
        if s.b < 0.5:
            self.sim.deliver_all()
        self.run_jobs(only=("grace_expiry", "restriction"))

    def step_deliver(self, s: Step) -> None:
        order = "created" if s.b < 0.4 else "reversed" if s.b < 0.55 else "shuffled"
        self.sim.deliver_all(order, seed=int(s.a * 1_000_000), include_delayed=False)

    def step_deliver_one(self, s: Step) -> None:
        with self.sim.lock:
            now = self.now().timestamp()
            ids = [e.event_id for e in self.sim.outbox if e.due_at <= now]
        event_id = _pick(ids, s.a)
        if event_id:
            self.sim.deliver(event_id)

    def step_duplicate(self, s: Step) -> None:
        self.sim.faults.duplicate_next_delivery(s.n)
        self.step_deliver(s)

    def step_redeliver_old(self, s: Step) -> None:
        delivered = [d.event_id for d in self.sim.delivery_log if d.ok]
        event_id = _pick(delivered, s.a)
        if event_id:
            self.sim.deliver(event_id)

    def step_delay(self, s: Step) -> None:
        seconds = 120 + s.a * (3 * 86400 if s.b < 0.3 else 3600)
        self.sim.faults.delay_deliveries(seconds, count=s.n)

    def step_pay_fault(self, s: Step) -> None:
        if s.b < 0.7:
            self.sim.faults.error_500("POST /v1/invoices/*/pay", apply=s.a < 0.8, count=s.n)
        else:
            self.sim.faults.timeout("POST /v1/invoices/*/pay", apply=s.a < 0.8,
                                    hold_seconds=self.stripe_timeout + 0.1, count=1)

    def step_reschedule(self, s: Step) -> None:
        candidates = [i for i in self.invoices("open", plans=("standard", "annual")) if i["next_payment_attempt"]]
        inv = _pick(candidates, s.a)
        if inv:
            self.sim.reschedule(inv["id"], int(self.now().timestamp() + 3600 + s.b * 5 * 86400))

    def step_outage(self, s: Step) -> None:
        until = self.now() + timedelta(days=1 + s.a * 4)
        if self.in_outage():  # the new end replaces the old one (the scheduler is back at `until`)
            self.outages[-1] = (self.outages[-1][0], until)
        else:
            self.outages.append((self.now(), until))
        self.outage_until = until

    def outage_overlaps(self, start: datetime, end: datetime) -> bool:
        """An injected outage (or a stretch the engine jumped without the scheduler) overlaps."""
        return any(a < end and start < b for a, b in self.scheduler_idle())

    def step_crash(self, s: Step) -> None:
        self.crash_armed = _pick(["after_prepared", "after_dispatching", "after_charge"], s.a)

    def step_retry_now(self, s: Step) -> None:
        if self.in_outage():
            return  # nobody could own an unknown outcome while the scheduler is down (see README)
        cycle = _pick(self.cycles(S.GRACE_ACTIVE, S.RETRY_SCHEDULED, S.PAYMENT_UNKNOWN, plans=("local",)), s.a)
        if cycle is None:
            return
        with contextlib.suppress(SimulatedCrash):
            cycle_retry_now(cycle_pk=cycle.pk, cause=Cause(kind=CauseKind.CUSTOMER, ref="retry-now",
                                                            actor="customer:simulation"), now=self.now())

    def step_mark_uncollectible(self, s: Step) -> None:
        inv = _pick(self.invoices("open"), s.a)
        if inv:
            self.sim.mark_uncollectible(inv["id"])

    def step_void(self, s: Step) -> None:
        inv = _pick(self.invoices("open", "uncollectible"), s.a)
        if inv:
            self.sim.void(inv["id"])

    def _charges(self, *, undisputed: bool = False) -> list[dict[str, Any]]:
        invoices = {i["id"] for i in self.invoices()}
        return [e for e in self.sim.ledger if e["invoice"] in invoices and e["refunded"] < e["amount"]
                and (not undisputed or e["dispute"] is None)]

    def step_refund(self, s: Step) -> None:
        charge = _pick(self._charges(undisputed=True), s.a)
        if charge:
            self.sim.refund(charge["id"], None if s.b < 0.5 else max(charge["amount"] // 2, 1))

    def step_dispute(self, s: Step) -> None:
        charges = self._charges(undisputed=True)
        restricted = {c.subscription.provider_subscription_id for c in self.cycles(S.RESTRICTED, S.GRACE_EXPIRED)}
        preferred = [c for c in charges if self.sim.get(c["invoice"])["subscription"] in restricted]
        charge = _pick(preferred or charges, s.a)
        if charge:
            self.sim.open_dispute(charge["id"])

    def step_close_dispute(self, s: Step) -> None:
        invoices = {i["id"] for i in self.invoices()}
        open_disputes = [e["dispute"] for e in self.sim.ledger if e["invoice"] in invoices and e["dispute"]
                         and e["dispute_status"] not in ("won", "lost")]
        dispute = _pick(open_disputes, s.a)
        if dispute:
            self.sim.close_dispute(dispute, won=s.b < 0.5)

    def step_outbox_replay(self, s: Step) -> None:
        published = list(OutboxMessage.objects.filter(
            published_at__isnull=False, subscription__provider_subscription_id__in=self.subscriptions).order_by("pk"))
        for message in published[int(s.a * len(published)):][: s.n]:
            CONSUMERS[message.topic](message, now=self.now())
        if s.b < 0.5:  # and the relay runs again over what is (not) pending
            self.run_jobs(only=("outbox_relay",))

    def step_stale_read(self, s: Step) -> None:
        inv = _pick(self.invoices(), s.a)
        if inv:
            self.sim.faults.stale_read(inv["id"], s.n)
            self.stale_invoices.add(inv["id"])

    def step_exception(self, s: Step) -> None:
        cycle = _pick(self.cycles(*EXCEPTION_SOURCE_STATES), s.a)
        if cycle is None:
            return
        cycle_accept_transition(
            cycle_pk=cycle.pk, edge="grant_exception", expect=Expect.from_cycle(cycle),
            cause=Cause.staff(self.lead, reason="simulated support decision", ticket=f"SIM-{self.step_index}"),
            params={"expires_at": self.now() + timedelta(hours=1 + s.b * 24 * 10),
                    "profile": "FULL" if s.n == 1 else "READ_EXPORT_NO_NEW_JOBS"},
            now=self.now(),
        )

    # ---- the contract line
    def step_cancel(self, s: Step) -> None:
        """The customer cancels at the provider: at once (its open invoices stay open but are no
        longer retried) or at the end of the current period."""
        sub = _pick(self.live_subscriptions(), s.a)
        if sub is None:
            return
        at_period_end = s.b >= 0.4
        if at_period_end and self.sim.get(sub)["cancel_at_period_end"]:
            return
        self.sim.cancel_subscription(sub, at_period_end=at_period_end)
        self.bump("cancel_at_period_end" if at_period_end else "cancel_now")

    def step_end_period(self, s: Step) -> None:
        """The period a subscription was set to cancel at runs out. When that end is near the
        clock moves there (scheduler and provider acting on the way: the application must
        close access at the period end even before the provider's event arrives); otherwise the
        provider ends the period now."""
        ending = [sub for sub in self.live_subscriptions() if self.sim.get(sub)["cancel_at_period_end"]]
        sub = _pick(ending, s.a)
        if sub is None:
            return
        end = datetime.fromtimestamp(self.sim.get(sub)["current_period_end"], tz=UTC)
        if self.now() < end <= self.now() + timedelta(days=10):
            self.advance((end - self.now()).total_seconds() + 1 + s.b * 120)
        if self.sim.get(sub)["status"] not in ENDED_STATUSES:
            self.sim.end_period(sub)

    def step_resubscribe(self, s: Step) -> None:
        """A customer whose subscriptions have all ended subscribes again (a new subscription)."""
        if len(self.subscriptions) >= 2 * len(self.schedule.plans) + 1:
            return
        live = {self.sim.get(sub)["customer"] for sub in self.live_subscriptions()}
        ended = list(dict.fromkeys(c for c in self.customers if c not in live))
        customer = _pick(ended, s.a)
        if customer is None:
            return
        self.sim.set_card(customer, "ok")
        self.subscribe(customer, _pick(list(PRICES), s.b))

    def step_pause(self, s: Step) -> None:
        sub = _pick([x for x in self.live_subscriptions() if not self.sim.get(x).get("pause_collection")], s.a)
        if sub is None:
            return
        behavior = _pick(list(PAUSE_BEHAVIORS), s.b)
        resumes_at = None if s.n == 3 else self.now() + timedelta(hours=2 + (s.b * 7 % 1) * 24 * 7)
        self.sim.pause_subscription(sub, resumes_at=resumes_at, behavior=behavior)

    def step_resume(self, s: Step) -> None:
        sub = _pick([x for x in self.live_subscriptions() if self.sim.get(x).get("pause_collection")], s.a)
        if sub is not None:
            self.sim.resume_subscription(sub)

    def step_change_plan(self, s: Step) -> None:
        """A price / interval change at the provider (monthly ↔ annual, provider ↔ local retries),
        preferably while one of the subscription's invoices is in dunning: open cycles keep their
        policy, the next invoices bind to the new price's."""
        live = self.live_subscriptions()
        dunning = {c.subscription.provider_subscription_id for c in self.cycles(*OPEN_STATES)}
        sub = _pick([x for x in live if x in dunning] or live, s.a)
        if sub is None:
            return
        plan = _pick([p for p in PRICES if p != self.plan_of[sub]], s.b)
        price, interval, amount = PRICES[plan]
        self.sim.change_price(sub, price, interval=interval, amount=amount)
        self.plan_of[sub] = plan

    def step_staff_cancel(self, s: Step) -> None:
        """A billing lead cancels a restricted cycle; the cancellation job carries it out on a fresh
        unpaid receipt and the provider is told through the outbox."""
        cycle = _pick(self.cycles(S.RESTRICTED), s.a)
        if cycle is None:
            return
        cycle_accept_transition(
            cycle_pk=cycle.pk, edge="request_cancellation", expect=Expect.from_cycle(cycle),
            cause=Cause.staff(self.lead, reason="simulated cancellation by a billing lead",
                              ticket=f"SIM-{self.step_index}"),
            now=self.now(),
        )
        if s.b < 0.5:
            self.run_jobs(only=("cancellation",))

    def step_cancel_fault(self, s: Step) -> None:
        """The provider's cancel endpoint answers 500 (applied or not) a few times, or for good."""
        count = s.n if s.b < 0.7 else 100_000
        self.sim.faults.error_500("DELETE /v1/subscriptions/*", apply=s.a < 0.5, count=count)

    def step_jobs_ahead(self, s: Step) -> None:
        self.run_jobs_ahead(timedelta(days=1 + s.a * 4))
