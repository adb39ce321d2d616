"""What an accepted step does beyond moving its line's state: ledger moves and bookkeeping.

Each effect runs inside the acceptance transaction with the intent, settlement, fulfillment and
wallet rows locked, and may refuse (a guard that needs the database: the balance, a deadline,
the clock). A refusal rolls back every step of the call. Two callers run effects on rows they
hold unlocked, each writing only through one statement that is guarded: the open's hold
(open_writes) and the upstream's answer on the rows as opened (acceptance.Known).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Model

from agentpay.bridge import now_is_not_ahead
from agentpay.models import (
    Fulfillment,
    IntentReceipt,
    LedgerAccount,
    PaymentIntent,
    PricedRoute,
    RefundObligation,
    Settlement,
    Transfer,
)
from agentpay.services.ledger import LedgerRefusal, ledger_capture, ledger_hold, ledger_release
from agentpay.services.onchain_effects import (
    ONCHAIN_EFFECTS,
    onchain_fulfillment_answer,
    onchain_status_query_failed,
    refund_record,
)
from agentpay.services.results import Cause, Refusal, Step
from agentpay.services.x402_effects import X402_EFFECTS
from agentpay.states import FULFILLMENT, INTENT, ONCHAIN, SETTLEMENT


@dataclass
class EffectContext:
    intent: PaymentIntent
    settlement: Settlement
    fulfillment: Fulfillment
    wallet: LedgerAccount | None
    cause: Cause
    now: datetime
    intent_fields: dict[str, Any] = field(default_factory=dict)
    settlement_fields: set[str] = field(default_factory=set)
    fulfillment_fields: set[str] = field(default_factory=set)
    # Not None: the intent is not inserted yet (intent_open's one statement): a DEFERRABLE effect
    # puts the rows it makes for the intent here, unsaved, and the open writes them with it.
    deferred: list[Model] | None = None
    # True: the hold's capture or release is made, not written: `resolution` (and the step that
    # asked it), for the acceptance to write with its generation (accept_writes), one statement.
    defer_resolution: bool = False
    # True: a hold on a cached system account is made, not written (settlement.hold unsaved), for
    # the open to write with its rows (open_writes), one statement.
    defer_hold: bool = False
    resolution: Transfer | None = None
    resolution_step: Step | None = None

    def insert(self, row: Model) -> None:
        """A new row of the intent's: written now, or with the intent when the open defers it."""
        if self.deferred is not None:
            self.deferred.append(row)
        else:
            row.save(force_insert=True)


Effect = Callable[[EffectContext, Step], None]
# A call still in progress this long after its timeouts lost its dispatcher (wallet-ledger-spec §9.2).
CRASH_RECOVERY_MARGIN_SECONDS = 60


def _not_ahead(ctx: EffectContext, step: Step) -> None:
    ok, clock = now_is_not_ahead(ctx.now)
    if not ok:
        raise Refusal("NOW_AFTER_TRUSTED_CLOCK", f"asked at {ctx.now.isoformat()}, the trusted clock reads "
                                                 f"{clock.isoformat()}", step)


def _wallet_shortfall(ctx: EffectContext) -> tuple[str, str]:
    """(reason, detail) why the wallet cannot hold this intent's amount; ('', '') when it can."""
    if ctx.wallet is None:
        return "no_wallet", f"the tenant has no {ctx.intent.currency} wallet"
    if ctx.wallet.frozen:
        return "account_frozen", "the tenant's wallet is frozen"
    if ctx.wallet.available < ctx.intent.amount:
        return "insufficient_balance", (f"available {ctx.wallet.available} {ctx.wallet.currency}, the call costs "
                                        f"{ctx.intent.amount}")
    return "", ""


def _amount_is_the_intents(ctx: EffectContext, step: Step, amount: int) -> None:
    asked = step.data.get("amount")
    if asked is not None and asked != amount:
        raise Refusal("AMOUNT_MISMATCH", f"asked for {asked}, the amount is {amount} (no partial capture)", step)


def hold_acquired(ctx: EffectContext, step: Step) -> None:
    _amount_is_the_intents(ctx, step, ctx.intent.amount)
    reason, shortfall = _wallet_shortfall(ctx)
    if reason:
        raise Refusal("WALLET_FROZEN" if reason == "account_frozen" else "INSUFFICIENT_BALANCE", shortfall, step)
    try:
        ctx.settlement.hold = ledger_hold(wallet=ctx.wallet, amount=ctx.intent.amount, intent=ctx.intent,
                                          actor=ctx.cause.actor, now=ctx.now, write=not ctx.defer_hold)
    except LedgerRefusal as refusal:
        raise Refusal(refusal.code, refusal.detail, step) from None
    ctx.settlement_fields.add("hold")


def hold_failed(ctx: EffectContext, step: Step) -> None:
    # A failure has to be true: a wallet that could hold the amount is not failed.
    reason, _ = _wallet_shortfall(ctx)
    if not reason:
        raise Refusal("HOLD_POSSIBLE", f"available {ctx.wallet.available} covers {ctx.intent.amount}", step)
    said = step.data.get("reason")
    if said is not None and said != reason and not (said == "insufficient_balance" and reason == "no_wallet"):
        raise Refusal("HOLD_FAILED_FOR_ANOTHER_REASON", f"the hold fails for {reason}, not {said}", step)


def _resolve_hold(resolve: Callable[..., Any]) -> Effect:
    def effect(ctx: EffectContext, step: Step) -> None:
        hold = ctx.settlement.hold
        if hold is None:
            raise Refusal("NO_HOLD", f"settlement {ctx.settlement.settlement_id} has no hold", step)
        _amount_is_the_intents(ctx, step, hold.amount)
        # One resolution per acceptance: a second one asked in the same steps is written at once
        # (its unique `pending` refuses it, as before).
        defer = ctx.defer_resolution and ctx.resolution is None
        try:
            made = resolve(hold=hold, actor=ctx.cause.actor, now=ctx.now, reason=ctx.cause.reason,
                           ticket=ctx.cause.ticket, write=not defer)
        except LedgerRefusal as refusal:
            raise Refusal(refusal.code, refusal.detail, step) from None
        if defer:
            ctx.resolution, ctx.resolution_step = made, step

    return effect


def undispatched_hold_ttl() -> timedelta:
    """How long a hold may wait for its call to be sent (wallet-ledger-spec §5.5)."""
    return timedelta(seconds=settings.AGENTPAY_UNDISPATCHED_HOLD_TTL_SECONDS)


def hold_expired(ctx: EffectContext, step: Step) -> None:
    """Release a hold whose call was never sent, once it has waited the TTL and no live request
    holds the intent's lease. The tables already refused it unless the fulfillment is not_started;
    `dispatched_at` is checked too, so no call that may have reached the upstream is released."""
    _not_ahead(ctx, step)
    hold = ctx.settlement.hold
    if hold is None:
        raise Refusal("NO_HOLD", f"settlement {ctx.settlement.settlement_id} has no hold", step)
    if ctx.fulfillment.dispatched_at is not None:
        raise Refusal("FULFILLMENT_DISPATCHED", f"dispatched at {ctx.fulfillment.dispatched_at.isoformat()}", step)
    expires = hold.created_at + undispatched_hold_ttl()
    if expires > ctx.now:
        raise Refusal("HOLD_NOT_EXPIRED", f"held at {hold.created_at.isoformat()}; expires at {expires.isoformat()}",
                      step)
    lease = ctx.intent.processing_until
    if lease is not None and lease > ctx.now:
        raise Refusal("REQUEST_IN_FLIGHT", f"a request holds the intent until {lease.isoformat()}", step)
    try:
        ledger_release(hold=hold, actor=ctx.cause.actor, now=ctx.now, reason="hold expired: never dispatched")
    except LedgerRefusal as refusal:
        raise Refusal(refusal.code, refusal.detail, step) from None


def authorization_never_held(ctx: EffectContext, step: Step) -> None:
    """The intent's hold_expired. With the settlement's hold_expired in the same acceptance
    (settlement now released), that step checked everything. Alone, from settlement not_started,
    it closes a wallet authorization whose hold was never taken (the request died between the
    two acceptances and the agent never retried): after the same TTL since the authorization, and
    only when no request holds the lease. Nothing was held, so nothing moves in the ledger."""
    if ctx.settlement.state != "not_started":
        return
    _not_ahead(ctx, step)
    expires = ctx.intent.state_changed_at + undispatched_hold_ttl()
    if expires > ctx.now:
        raise Refusal("AUTHORIZATION_NOT_EXPIRED", f"authorized at {ctx.intent.state_changed_at.isoformat()}; "
                                                   f"expires at {expires.isoformat()}", step)
    lease = ctx.intent.processing_until
    if lease is not None and lease > ctx.now:
        raise Refusal("REQUEST_IN_FLIGHT", f"a request holds the intent until {lease.isoformat()}", step)


def dispatch(ctx: EffectContext, step: Step) -> None:
    ctx.fulfillment.dispatched_at = ctx.now
    ctx.fulfillment_fields.add("dispatched_at")


def upstream_timeout_seconds(route: PricedRoute) -> float:
    """How long one forwarded call may take: connect + the full answer."""
    return route.connect_timeout_seconds + route.read_timeout_seconds


def _status_fits(step: Step) -> None:
    """The observation must be what the event says (the spec's observation_mapping)."""
    status, event = step.data.get("status"), step.event
    klass = None if status is None else int(status) // 100
    if event == "upstream_2xx" and (klass not in (None, 2) or step.data.get("body_complete") is False):
        raise Refusal("NOT_A_COMPLETE_2XX", f"status {status}, body complete: {step.data.get('body_complete')}", step)
    if event == "upstream_4xx" and klass not in (None, 4):
        raise Refusal("NOT_A_4XX", f"status {status} is not a 4xx", step)
    if event == "upstream_5xx" and klass in (2, 4):
        raise Refusal("NOT_AN_UNKNOWN_ANSWER", f"status {status} is conclusive", step)


def upstream_answer(ctx: EffectContext, step: Step) -> None:
    _status_fits(step)
    f = ctx.fulfillment
    if step.data.get("cause") == "crash_recovery":
        lost_after = timedelta(seconds=upstream_timeout_seconds(ctx.intent.route) + CRASH_RECOVERY_MARGIN_SECONDS)
        if f.dispatched_at is None or f.dispatched_at + lost_after > ctx.now:
            raise Refusal("DISPATCHER_MAY_BE_ALIVE", f"dispatched at {f.dispatched_at}; lost only after "
                                                     f"{lost_after.total_seconds():.0f} s", step)
    status = step.data.get("status")
    if status is not None:
        f.upstream_status_code = int(status)
        ctx.fulfillment_fields.add("upstream_status_code")
    if step.data.get("error"):
        f.upstream_error = str(step.data["error"])[:2000]
        ctx.fulfillment_fields.add("upstream_error")
    if step.event in ("upstream_5xx", "upstream_timeout"):
        # seed §4.1: the recovery deadline counts from the moment the outcome became unknown.
        f.unknown_since = ctx.now
        f.recovery_deadline = ctx.now + timedelta(seconds=settings.AGENTPAY_RECOVERY_DEADLINE_SECONDS)
        ctx.fulfillment_fields |= {"unknown_since", "recovery_deadline"}


def status_query_evidence(ctx: EffectContext, step: Step) -> None:
    """What proves an unknown fulfillment's outcome (wallet-ledger-spec §9.3, §9.4): the upstream's
    status query answering succeeded / failed / a fenced not_found, or a billing lead's
    attestation (`source: manual`, checked by the acceptance service)."""
    source, answer = step.data.get("source"), step.data.get("answer")
    if source == "manual":
        return
    if source != "status_query":
        raise Refusal("NO_EVIDENCE", f"{step.event} needs a status-query answer or a billing lead's attestation",
                      step)
    if step.event == "upstream_status_query_ok":
        if answer != "succeeded":
            raise Refusal("NOT_EVIDENCE", f"the status query answered {answer!r}, not succeeded", step)
        return
    if answer == "failed":
        return
    if answer != "not_found":
        raise Refusal("NOT_EVIDENCE", f"the status query answered {answer!r}, not failed", step)
    route, since = ctx.intent.route, ctx.fulfillment.unknown_since
    if step.data.get("fenced") is not True or not route.fences_not_found:
        raise Refusal("NOT_FOUND_UNFENCED", "not_found is evidence only when fenced, on a route that fences it", step)
    closed_for = (ctx.now - since).total_seconds() if since else 0.0
    if closed_for < upstream_timeout_seconds(route):
        raise Refusal("NOT_FOUND_TOO_EARLY", f"asked {closed_for:.0f} s after our connection closed; the call may "
                                             f"take {upstream_timeout_seconds(route):.0f} s", step)


def manual_resolved_failed(ctx: EffectContext, step: Step) -> None:
    if ctx.settlement.state != "confirmed":
        return
    if ctx.intent.rail == ONCHAIN:
        # Paid on chain, not delivered: closing the intent records what we owe (C08, C09).
        refund_record(ctx, step)
    elif step.data.get("refund_obligation") != "recorded":
        raise Refusal("REFUND_NOT_RECORDED", "a paid, undelivered call closes once its refund is recorded", step)


def deadline_passed(ctx: EffectContext, step: Step) -> None:
    _not_ahead(ctx, step)
    deadline = ctx.fulfillment.recovery_deadline
    if deadline is None or deadline > ctx.now:
        raise Refusal("DEADLINE_NOT_REACHED", f"the recovery deadline is {deadline and deadline.isoformat()}", step)


def fulfillment_deadline_passed(ctx: EffectContext, step: Step) -> None:
    """The fulfillment's self-loop is recorded once (the spec's choice C02)."""
    deadline_passed(ctx, step)
    if IntentReceipt.objects.filter(intent=ctx.intent, line=FULFILLMENT, event=step.event, accepted=True).exists():
        raise Refusal("DEADLINE_ALREADY_RECORDED", "the recovery deadline of this fulfillment is recorded", step)


def intent_needs_review(ctx: EffectContext, step: Step) -> None:
    deadline_passed(ctx, step)
    if (ctx.intent.rail == ONCHAIN and ctx.settlement.state == "confirmed" and ctx.fulfillment.state == "failed"
            and not RefundObligation.objects.filter(intent=ctx.intent).exists()):
        # C08: what keeps a paid, undelivered call unresolved is its refund obligation.
        raise Refusal("NO_REFUND_OBLIGATION", "a refund-required intent goes to review with its refund obligation",
                      step)
    ctx.intent_fields["needs_review_at"] = ctx.now


def challenge_issued(ctx: EffectContext, step: Step) -> None:
    ctx.intent_fields["challenged_at"] = ctx.now


def challenge_timeout(ctx: EffectContext, step: Step) -> None:
    _not_ahead(ctx, step)
    issued = ctx.intent.challenged_at
    ttl = timedelta(seconds=settings.AGENTPAY_CHALLENGE_TTL_SECONDS)
    if issued is None or issued + ttl > ctx.now:
        raise Refusal("CHALLENGE_NOT_EXPIRED", f"the challenge was issued at {issued and issued.isoformat()}", step)


EFFECTS: dict[tuple[str, str], Effect] = {
    (SETTLEMENT, "hold_acquired"): hold_acquired,
    (SETTLEMENT, "hold_failed"): hold_failed,
    (SETTLEMENT, "capture"): _resolve_hold(ledger_capture),
    (SETTLEMENT, "release"): _resolve_hold(ledger_release),
    (SETTLEMENT, "hold_expired"): hold_expired,
    (FULFILLMENT, "dispatch"): dispatch,
    (FULFILLMENT, "upstream_2xx"): upstream_answer,
    (FULFILLMENT, "upstream_4xx"): onchain_fulfillment_answer(upstream_answer),
    (FULFILLMENT, "upstream_5xx"): upstream_answer,
    (FULFILLMENT, "upstream_timeout"): upstream_answer,
    (FULFILLMENT, "upstream_status_query_ok"): status_query_evidence,
    (FULFILLMENT, "upstream_status_query_failed"): onchain_status_query_failed(status_query_evidence),
    (FULFILLMENT, "recovery_deadline_exceeded"): fulfillment_deadline_passed,
    (INTENT, "manual_resolved_failed"): manual_resolved_failed,
    (INTENT, "recovery_deadline_exceeded"): intent_needs_review,
    (INTENT, "hold_expired"): authorization_never_held,
    (INTENT, "challenge_issued"): challenge_issued,
    (INTENT, "timeout"): challenge_timeout,
    # x402 (issue 18): the challenge and the payer's authorization, written in the acceptance.
    **X402_EFFECTS,
    # settle (issue 18): the on-chain settlement line and the refund it may leave owed.
    **ONCHAIN_EFFECTS,
}
