"""The on-chain settlement line's effects (issue 18; settle's part of `effects.EFFECTS`).

They run inside `intent_accept`'s transaction, with the intent's rows locked, and never call the
chain: the evidence was read before (agentpay.chain.settlement) and is checked here against what
the database holds. The rule they keep: no settlement step without our persisted transaction
(sign + persist + commit before broadcast), and a paid, undelivered call leaves a refund
obligation written in the same acceptance (C08, C09).

`ctx` is `effects.EffectContext` (not imported: effects imports this module).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings

from agentpay.models import ChainAuthorization, ChainTransaction, RefundObligation
from agentpay.services.results import Refusal, Step
from agentpay.states import INTENT, ONCHAIN, SETTLEMENT

Effect = Callable[[Any, Step], None]


def _chain_tx(ctx: Any, step: Step) -> ChainTransaction:
    tx = ChainTransaction.objects.filter(settlement=ctx.settlement).first()
    if tx is None:
        raise Refusal("TX_NOT_PERSISTED", f"settlement {ctx.settlement.settlement_id} has no signed, persisted "
                                          f"transaction: nothing was broadcast", step)
    said = step.data.get("tx_hash")
    if said is not None and said != tx.tx_hash:
        raise Refusal("TX_HASH_MISMATCH", f"the step names {said}; the persisted transaction is {tx.tx_hash}", step)
    return tx


def _unknown_since(ctx: Any) -> None:
    """The intent's recovery deadline counts from the moment its settlement became unknown
    (seed §4.1; O23). Kept on the fulfillment row, where the deadline guard reads it; a later
    fulfillment unknown sets its own."""
    if ctx.fulfillment.recovery_deadline is None:
        ctx.fulfillment.recovery_deadline = ctx.now + timedelta(seconds=settings.AGENTPAY_RECOVERY_DEADLINE_SECONDS)
        ctx.fulfillment_fields.add("recovery_deadline")


def settlement_step(ctx: Any, step: Step) -> None:
    _chain_tx(ctx, step)
    if step.event in ("submit_timeout", "query_timeout"):
        _unknown_since(ctx)
    if step.event == "confirmations_reached":
        seen, needed = step.data.get("confirmations"), ctx.intent.authorization.network.confirmations
        if seen is not None and int(seen) < needed:
            raise Refusal("TOO_FEW_CONFIRMATIONS", f"{seen} confirmations; this network needs {needed}", step)


def authorization_expired(ctx: Any, step: Step) -> None:
    """Only an authorization we never signed a transaction for expires this way: a signed one
    may have landed, and only the chain's evidence may say it did not."""
    authorization = ChainAuthorization.objects.filter(intent=ctx.intent).first()
    if authorization is None:
        raise Refusal("NO_AUTHORIZATION", "the intent has no signed authorization", step)
    if ChainTransaction.objects.filter(settlement=ctx.settlement).exists():
        raise Refusal("TX_SIGNED", "a transaction was signed for this settlement: the queries decide", step)
    valid_before = datetime.fromtimestamp(int(authorization.valid_before), tz=UTC)
    if ctx.now < valid_before:
        raise Refusal("AUTHORIZATION_STILL_VALID", f"valid before {valid_before.isoformat()}", step)


def refund_record(ctx: Any, step: Step) -> RefundObligation:
    """The refund obligation of a paid, undelivered call, written once (its own id, rfd_…)."""
    existing = RefundObligation.objects.filter(intent=ctx.intent).first()
    if existing is not None:
        return existing
    authorization = ChainAuthorization.objects.filter(intent=ctx.intent).select_related("network").first()
    if authorization is None:
        raise Refusal("NO_AUTHORIZATION", "a refund goes back to the payer of a signed authorization", step)
    return RefundObligation.objects.create(
        intent=ctx.intent, network=authorization.network, payer=authorization.payer, amount=authorization.value,
        created_at=ctx.now, state_changed_at=ctx.now)


def onchain_fulfillment_answer(answer: Effect) -> Effect:
    """An upstream 4xx after an on-chain payment: the answer's effect, then the refund owed. The
    intent stays authorized (C08) until the recovery deadline, counted from now."""
    def effect(ctx: Any, step: Step) -> None:
        answer(ctx, step)
        if ctx.intent.rail == ONCHAIN:
            refund_record(ctx, step)
            ctx.fulfillment.recovery_deadline = ctx.now + timedelta(
                seconds=settings.AGENTPAY_RECOVERY_DEADLINE_SECONDS)
            ctx.fulfillment_fields.add("recovery_deadline")

    return effect


def onchain_status_query_failed(evidence: Effect) -> Effect:
    """Proven not delivered after an on-chain payment (O22, O26): the refund is owed."""
    def effect(ctx: Any, step: Step) -> None:
        evidence(ctx, step)
        if ctx.intent.rail == ONCHAIN and ctx.settlement.state == "confirmed":
            refund_record(ctx, step)

    return effect


ONCHAIN_EFFECTS: dict[tuple[str, str], Effect] = {
    **{(SETTLEMENT, event): settlement_step for event in (
        "submit_ok", "submit_rejected_definitely", "submit_timeout", "seen_on_chain", "query_timeout",
        "confirmations_reached", "reverted", "query_found_confirmed", "query_found_failed", "query_found_pending",
        "query_still_unknown")},
    (INTENT, "authorization_expired"): authorization_expired,
}
