"""The on-chain settlement of one intent (seed 004 §4.2; issue 18 item 3).

`settlement_submit`: sign the submitter's transferWithAuthorization for the intent's signed
authorization, persist it (raw bytes and precomputed hash) and commit, then broadcast the same
bytes: submit_ok → submitted, no answer → unknown, a definite rejection → failed. Called again
for an intent whose transaction is persisted but was never broadcast (a crash in between), it
signs nothing and sends the persisted bytes.

`settlement_query`: one round of evidence (`agentpay.chain.transactions.chain_tx_evidence`)
turned into the steps of the settlement line. An unknown is resolved only by the receipt by
hash, authorizationState and AuthorizationUsed; a transaction the node forgot while its
authorization is still valid is sent again byte for byte (never re-signed); an authorization
past validBefore and unused is failed.

Reorgs: only a canonical receipt at depth ≥ network.confirmations confirms; a shallower one
is `seen` and may disappear again (then the same bytes are rebroadcast). A reorg deeper than the
depth after `confirmed` cannot change the line (terminal states never change): it is a finding
for the auditor and the review queue (`settlement_audit_confirmed`), not a state change.

Edges the seed's table lacks are taken honestly: from `submitted`, a query that cannot find
the transaction anywhere is `query_timeout` (the outcome is unknown) and, when the chain shows
the authorization expired or canceled unused, `query_found_failed` follows in the same
acceptance.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from agentpay.bridge import trusted_now
from agentpay.chain import rpc
from agentpay.chain.transactions import (
    Evidence,
    authorization_calldata,
    chain_tx_broadcast,
    chain_tx_evidence,
    chain_tx_record,
    chain_tx_sign,
)
from agentpay.models import ChainTransaction, ChainTxPurpose, PaymentIntent, Settlement
from agentpay.services.acceptance import intent_accept, lines_of
from agentpay.services.results import Cause, Outcome, Step
from agentpay.states import SETTLEMENT_TERMINAL

LIVE = ("submitted", "pending", "unknown")


def _load(intent_id: str) -> tuple[PaymentIntent, Settlement, ChainTransaction | None]:
    intent = (PaymentIntent.objects.select_related("authorization__network", "fulfillment")
              .get(intent_id=intent_id))
    settlement = intent.settlements.order_by("-pk").first()
    tx = ChainTransaction.objects.select_related("network").filter(settlement=settlement).first()
    return intent, settlement, tx


def _unchanged(intent: PaymentIntent, settlement: Settlement, detail: str, code: str = "NO_NEW_EVIDENCE"
               ) -> Outcome:
    """No step taken: nothing new was learned (or nothing could be done)."""
    return Outcome(accepted=False, intent_id=intent.intent_id, generation=intent.generation,
                   lines=lines_of(intent, settlement, intent.fulfillment), refusal_code=code, detail=detail)


def settlement_sign(intent: PaymentIntent, settlement: Settlement, *, now: datetime) -> ChainTransaction:
    authorization = intent.authorization
    network = authorization.network
    return chain_tx_sign(network=network, sender=network.submitter, to=network.token_address,
                         data=authorization_calldata(authorization), owner={"settlement": settlement},
                         purpose=ChainTxPurpose.SETTLEMENT, now=now)


def settlement_submit(intent_id: str, *, cause: Cause, now: datetime | None = None) -> Outcome:
    now = now or trusted_now()
    intent, settlement, tx = _load(intent_id)
    if intent.state != "authorized" or settlement.state != "not_started":
        return _unchanged(intent, settlement, f"nothing to submit: intent {intent.state}, settlement "
                                              f"{settlement.state}")
    if tx is None:
        try:
            tx = settlement_sign(intent, settlement, now=now)  # committed before anything is sent
        except (rpc.ChainTimeout, rpc.ChainRejected) as exc:
            # Nothing signed, nothing sent: the authorization is untouched; a replay tries again.
            return _unchanged(intent, settlement, f"the chain did not answer before signing: {exc}",
                              code="CHAIN_UNAVAILABLE")
    answer = chain_tx_broadcast(tx, now=now)
    data = {"tx_hash": tx.tx_hash, "tx_id": tx.tx_id, "answer": answer.detail[:500],
            "tx_hash_persisted_before_broadcast": True}
    if answer.kind == "ok":
        steps = [Step("settlement", "submit_ok", data)]
    elif answer.kind == "rejected":
        steps = [Step("settlement", "submit_rejected_definitely", {**data, "reason": answer.detail[:200]}),
                 Step("intent", "settlement_failed")]
    else:
        # No answer, or a refusal that does not prove these bytes can never land: unknown.
        steps = [Step("settlement", "submit_timeout", {**data, "broadcast": answer.kind})]
    outcome = intent_accept(intent_id=intent_id, steps=steps, cause=cause, now=now)
    if outcome.accepted and outcome.lines.settlement in SETTLEMENT_TERMINAL:
        chain_tx_record(tx, now=now, terminal=True)
    return outcome


@dataclass(frozen=True)
class Round:
    """The steps one round of evidence proves for a line in `state`, and whether to rebroadcast."""

    steps: tuple[tuple[str, dict], ...]
    rebroadcast: bool = False


def steps_for(state: str, evidence: Evidence) -> Round:
    """From the line's state and what the chain showed, the line's events (settlement and refund
    alike). `dropped`: rebroadcast the same bytes and stay."""
    data = {"evidence": evidence.kind, "detail": evidence.detail[:500]}
    if evidence.carried_by:
        data["carried_by"] = evidence.carried_by
    kind = evidence.kind
    if kind == "confirmed":
        event = {"submitted": ("seen_on_chain", "confirmations_reached"), "pending": ("confirmations_reached",),
                 "unknown": ("query_found_confirmed",)}[state]
    elif kind == "seen":
        event = {"submitted": ("seen_on_chain",), "pending": (), "unknown": ("query_found_pending",)}[state]
    elif kind == "failed" and evidence.reverted:
        event = {"submitted": ("seen_on_chain", "reverted"), "pending": ("reverted",),
                 "unknown": ("query_found_failed",)}[state]
    elif kind == "failed":
        # No receipt of ours: the table reaches failed only through unknown.
        event = ("query_found_failed",) if state == "unknown" else ("query_timeout", "query_found_failed")
    elif kind == "timeout":
        event = {"submitted": ("query_timeout",), "pending": ("query_timeout",), "unknown": ("query_still_unknown",)}[
            state]
    elif kind == "dropped":
        return Round((), rebroadcast=True)
    else:  # review: the line stays; the answer is on the transaction for the reviewer
        event = {"unknown": ("query_still_unknown",)}.get(state, ())
    return Round(tuple((e, data) for e in event))


def settlement_query(intent_id: str, *, cause: Cause, now: datetime | None = None) -> Outcome:
    """One round of evidence for the intent's settlement; a persisted, never-broadcast
    transaction is broadcast (the same bytes) instead."""
    now = now or trusted_now()
    intent, settlement, tx = _load(intent_id)
    if tx is None:
        return _unchanged(intent, settlement, "no transaction signed for this settlement")
    if settlement.state == "not_started":
        return settlement_submit(intent_id, cause=cause, now=now)  # crashed between persist and broadcast
    if settlement.state not in LIVE:
        chain_tx_record(tx, now=now, terminal=True)
        return _unchanged(intent, settlement, f"the settlement is {settlement.state}")
    evidence = chain_tx_evidence(tx, intent.authorization)
    found = steps_for(settlement.state, evidence)
    steps = [Step("settlement", event, data) for event, data in found.steps]
    if found.rebroadcast:
        answer = chain_tx_broadcast(tx, now=now)
        detail = f"{evidence.detail}; sent the same bytes again: {answer.kind} {answer.detail}"[:500]
        if settlement.state == "unknown":
            event = "query_found_pending" if answer.kind == "ok" else "query_still_unknown"
            steps = [Step("settlement", event, {"evidence": "rebroadcast", "detail": detail})]
        elif settlement.state == "submitted" and answer.kind != "ok":
            steps = [Step("settlement", "query_timeout", {"evidence": "rebroadcast", "detail": detail})]
    terminal_failed = any(step.event in ("reverted", "query_found_failed") for step in steps)
    if terminal_failed and intent.state == "authorized":
        # states.py: a failed settlement fails the intent (authorization_expired is only for a
        # settlement never started); in needs_review the owner closes it.
        steps.append(Step("intent", "settlement_failed"))
    done = terminal_failed or any(step.event in ("confirmations_reached", "query_found_confirmed") for step in steps)
    chain_tx_record(tx, now=now, evidence=evidence, terminal=done)
    if not steps:
        return _unchanged(intent, settlement, evidence.detail)
    return intent_accept(intent_id=intent_id, steps=steps, cause=cause, now=now)


def settlement_authorization_expire(intent_id: str, *, cause: Cause, now: datetime | None = None) -> Outcome:
    """An authorized intent whose settlement never started and whose authorization is past
    validBefore expires (seed §4.1 authorization_expired; the effect checks no tx was signed)."""
    now = now or trusted_now()
    return intent_accept(intent_id=intent_id, cause=cause, now=now,
                         steps=[Step("intent", "authorization_expired", {"valid_before_passed": True})])


def settlement_audit_confirmed(intent_id: str) -> Evidence:
    """Re-read a confirmed settlement's evidence (a reorg deeper than the depth is a finding for
    the auditor: the state stays confirmed). Returns what the chain shows now."""
    intent, _, tx = _load(intent_id)
    if tx is None:
        return Evidence("review", "confirmed without a transaction")
    return chain_tx_evidence(tx, intent.authorization)
