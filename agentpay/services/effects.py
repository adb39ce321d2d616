"""What an accepted step does beyond moving its line's state: ledger moves and bookkeeping.

Each effect runs inside the acceptance transaction with the intent, settlement, fulfillment and
wallet rows locked, and may refuse (a guard that needs the database: the balance, a deadline,
the clock). A refusal rolls back every step of the call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings

from agentpay.bridge import now_is_not_ahead
from agentpay.models import Fulfillment, LedgerAccount, PaymentIntent, Settlement, TenantStatus
from agentpay.services.ledger import LedgerRefusal, ledger_capture, ledger_hold, ledger_release
from agentpay.services.results import Cause, Refusal, Step
from agentpay.states import FULFILLMENT, INTENT, SETTLEMENT


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


Effect = Callable[[EffectContext, Step], None]


def _not_ahead(ctx: EffectContext, step: Step) -> None:
    ok, clock = now_is_not_ahead(ctx.now)
    if not ok:
        raise Refusal("NOW_AFTER_TRUSTED_CLOCK", f"asked at {ctx.now.isoformat()}, the trusted clock reads "
                                                 f"{clock.isoformat()}", step)


def _wallet_shortfall(ctx: EffectContext) -> str:
    """Why the wallet cannot hold this intent's amount ('' when it can)."""
    if ctx.intent.tenant.status == TenantStatus.FROZEN:
        return "the tenant's wallet is frozen"
    if ctx.wallet is None:
        return f"the tenant has no {ctx.intent.currency} wallet (available 0)"
    if ctx.wallet.available < ctx.intent.amount:
        return f"available {ctx.wallet.available} {ctx.wallet.currency}, the call costs {ctx.intent.amount}"
    return ""


def hold_acquired(ctx: EffectContext, step: Step) -> None:
    shortfall = _wallet_shortfall(ctx)
    if shortfall:
        raise Refusal("INSUFFICIENT_BALANCE", shortfall, step)
    try:
        ctx.settlement.hold = ledger_hold(wallet=ctx.wallet, amount=ctx.intent.amount, intent=ctx.intent,
                                          actor=ctx.cause.actor, now=ctx.now)
    except LedgerRefusal as refusal:
        raise Refusal(refusal.code, refusal.detail, step) from None
    ctx.settlement_fields.add("hold")


def hold_failed(ctx: EffectContext, step: Step) -> None:
    # A failure has to be true: a wallet that could hold the amount is not failed.
    if not _wallet_shortfall(ctx):
        raise Refusal("HOLD_POSSIBLE", f"available {ctx.wallet.available} covers {ctx.intent.amount}", step)


def _resolve_hold(resolve: Callable[..., Any]) -> Effect:
    def effect(ctx: EffectContext, step: Step) -> None:
        hold = ctx.settlement.hold
        if hold is None:
            raise Refusal("NO_HOLD", f"settlement {ctx.settlement.settlement_id} has no hold", step)
        try:
            resolve(hold=hold, actor=ctx.cause.actor, now=ctx.now, reason=ctx.cause.reason, ticket=ctx.cause.ticket)
        except LedgerRefusal as refusal:
            raise Refusal(refusal.code, refusal.detail, step) from None

    return effect


def dispatch(ctx: EffectContext, step: Step) -> None:
    f = ctx.fulfillment
    f.dispatched_at = ctx.now
    f.recovery_deadline = ctx.now + timedelta(seconds=settings.AGENTPAY_RECOVERY_DEADLINE_SECONDS)
    ctx.fulfillment_fields |= {"dispatched_at", "recovery_deadline"}


def upstream_answer(ctx: EffectContext, step: Step) -> None:
    f = ctx.fulfillment
    status = step.data.get("status")
    if status is not None:
        f.upstream_status_code = int(status)
        ctx.fulfillment_fields.add("upstream_status_code")
    if step.data.get("error"):
        f.upstream_error = str(step.data["error"])[:2000]
        ctx.fulfillment_fields.add("upstream_error")
    if step.event in ("upstream_5xx", "upstream_timeout"):
        f.unknown_since = ctx.now
        ctx.fulfillment_fields.add("unknown_since")


def deadline_passed(ctx: EffectContext, step: Step) -> None:
    _not_ahead(ctx, step)
    deadline = ctx.fulfillment.recovery_deadline
    if deadline is None or deadline > ctx.now:
        raise Refusal("DEADLINE_NOT_REACHED", f"the recovery deadline is {deadline and deadline.isoformat()}", step)


def intent_needs_review(ctx: EffectContext, step: Step) -> None:
    deadline_passed(ctx, step)
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
    (FULFILLMENT, "dispatch"): dispatch,
    (FULFILLMENT, "upstream_2xx"): upstream_answer,
    (FULFILLMENT, "upstream_4xx"): upstream_answer,
    (FULFILLMENT, "upstream_5xx"): upstream_answer,
    (FULFILLMENT, "upstream_timeout"): upstream_answer,
    (FULFILLMENT, "recovery_deadline_exceeded"): deadline_passed,
    (INTENT, "recovery_deadline_exceeded"): intent_needs_review,
    (INTENT, "challenge_issued"): challenge_issued,
    (INTENT, "timeout"): challenge_timeout,
}
