"""Refunds of paid, undelivered on-chain calls (seed 004 §3.1 refund_required; issue 18 item 4).

A RefundObligation (rfd_…) is written in the acceptance that proves the call undelivered (the
upstream's 4xx, a status query's "failed", a lead's "not delivered"). It enters the refund
queue at once; a billing lead (`agentpay.resolve_review`) pays it back on chain with a reason
and a ticket, through the same machinery as a settlement: a token `transfer(payer, amount)`
from pay_to, signed once, persisted and committed, then broadcast; its line is the on-chain
settlement's (not_started → submitted → pending → confirmed, with unknown and failed), resolved
only by evidence. `refund_accept` is the obligation's one writer (row lock + generation
compare-and-set); each of its steps is also a receipt (line "refund") on the intent's timeline.

Once the refund is confirmed, the intent is closed by that lead as `manual_resolved_failed`
(with the refund recorded) as soon as the tables allow: at once when the intent is in
needs_review, else when the recovery deadline took it there (C08; agentpay.chain.reconcile).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction

from agentpay.bridge import trusted_now
from agentpay.chain import token
from agentpay.chain.settlement import LIVE, steps_for
from agentpay.chain.transactions import chain_tx_broadcast, chain_tx_evidence, chain_tx_record, chain_tx_sign
from agentpay.models import ChainTransaction, ChainTxPurpose, IntentReceipt, PaymentIntent, RefundObligation
from agentpay.services.acceptance import REVIEW_PERMISSION, intent_accept
from agentpay.services.results import Cause, Outcome, Refusal, Step
from agentpay.states import ONCHAIN, ROWS, SETTLEMENT, SETTLEMENT_TERMINAL, SETTLEMENT_TRANSITIONS

# The refund's line: the on-chain rows of the settlement table, nothing else.
REFUND_TRANSITIONS = {(s, e): to for (s, e), to in SETTLEMENT_TRANSITIONS.items()
                      if ROWS[(SETTLEMENT, s, e)][1] == (ONCHAIN,)}
ASSIGN = "owner_assigned"


@dataclass(frozen=True)
class RefundResult:
    accepted: bool
    refund_id: str
    state: str
    generation: int
    refusal_code: str = ""
    detail: str = ""


def _person(user: Any, reason: str, ticket: str) -> None:
    if not user.has_perm(REVIEW_PERMISSION):
        raise Refusal("NOT_PERMITTED", f"{user.get_username()} may not pay AgentPay refunds")
    if not reason.strip() or not ticket.strip():
        raise Refusal("REASON_AND_TICKET_REQUIRED", "a refund needs a reason and a ticket")


def refund_open(intent_id: str, *, now: datetime | None = None) -> RefundObligation:
    """The obligation of a paid, undelivered intent (normally written by the acceptance that
    proved it undelivered; this is for a caller right after one)."""
    now = now or trusted_now()
    with transaction.atomic(durable=True):
        intent = PaymentIntent.objects.select_for_update().select_related("authorization__network").get(
            intent_id=intent_id)
        existing = RefundObligation.objects.filter(intent=intent).first()
        if existing is not None:
            return existing
        if not intent.settlements.filter(state="confirmed").exists():
            raise Refusal("NOT_PAID", f"{intent_id} has no confirmed settlement: nothing to refund")
        auth = intent.authorization
        return RefundObligation.objects.create(intent=intent, network=auth.network, payer=auth.payer,
                                               amount=auth.value, created_at=now, state_changed_at=now)


def refund_accept(refund_id: str, *, events: list[tuple[str, dict]], cause: Cause, now: datetime,
                  expect_generation: int | None = None, owner: Any = None) -> RefundResult:
    """The one writer of a RefundObligation: its state events in order (all or none), or
    `ASSIGN` (owner, reason and ticket from `cause`)."""
    try:
        with transaction.atomic(durable=True):
            refund = RefundObligation.objects.select_for_update().get(refund_id=refund_id)
            if expect_generation is not None and refund.generation != expect_generation:
                raise Refusal("STALE_GENERATION", f"expected generation {expect_generation}, found "
                              f"{refund.generation}")
            state, changes, receipts = refund.state, {}, []
            for event, data in events:
                if event == ASSIGN:
                    changes.update(owner=owner, owner_assigned_at=now, reason=cause.reason, ticket=cause.ticket)
                    receipts.append((event, state, state, {"owner": owner.get_username(), **data}))
                    continue
                if state in SETTLEMENT_TERMINAL:
                    raise Refusal("TERMINAL_STATE", f"the refund is {state}")
                to = REFUND_TRANSITIONS.get((state, event))
                if to is None:
                    raise Refusal("EVENT_NOT_ALLOWED", f"{event} is not a refund transition from {state}")
                receipts.append((event, state, to, data))
                state = to
            if state != refund.state:
                changes.update(state=state, state_changed_at=now)
            changed = RefundObligation.objects.filter(pk=refund.pk, generation=refund.generation).update(
                generation=refund.generation + 1, **changes)
            if changed != 1:
                raise Refusal("STALE_GENERATION", "the refund changed meanwhile")
            # On the intent's timeline, at the intent's generation (a refund step moves no line of it).
            intent_generation = PaymentIntent.objects.values_list("generation", flat=True).get(pk=refund.intent_id)
            IntentReceipt.objects.bulk_create([
                IntentReceipt(intent_id=refund.intent_id, line="refund", event=event, accepted=True,
                              from_state=before, to_state=after, generation=intent_generation,
                              data={"refund_id": refund_id, "refund_generation": refund.generation + 1, **data},
                              cause_kind=cause.kind, actor=cause.actor,
                              actor_user=cause.user, request_id=cause.request_id, reason=cause.reason,
                              ticket=cause.ticket, trusted_time=now)
                for event, before, after, data in receipts])
        return RefundResult(True, refund_id, state, refund.generation + 1)
    except Refusal as refusal:
        current = RefundObligation.objects.get(refund_id=refund_id)
        return RefundResult(False, refund_id, current.state, current.generation, refusal.code, refusal.detail)


def refund_assign(refund_id: str, *, user: Any, reason: str, ticket: str, now: datetime | None = None
                  ) -> RefundResult:
    _person(user, reason, ticket)
    return refund_accept(refund_id, events=[(ASSIGN, {})], cause=Cause.person(user, reason=reason, ticket=ticket),
                         now=now or trusted_now(), owner=user)


def refund_pay(refund_id: str, *, user: Any, reason: str, ticket: str, now: datetime | None = None) -> RefundResult:
    """A billing lead pays the refund back on chain: sign once, persist, commit, broadcast."""
    _person(user, reason, ticket)
    now = now or trusted_now()
    cause = Cause.person(user, reason=reason, ticket=ticket)
    refund = RefundObligation.objects.select_related("network").get(refund_id=refund_id)
    if refund.state != "not_started":
        raise Refusal("ALREADY_PAID", f"the refund is {refund.state}; it is never paid twice")
    assigned = refund_accept(refund_id, events=[(ASSIGN, {"paying": True})], cause=cause, now=now, owner=user,
                             expect_generation=refund.generation)
    if not assigned.accepted:
        return assigned
    network = refund.network
    tx = chain_tx_sign(network=network, sender=network.pay_to, to=network.token_address,
                       data=token.transfer_calldata(refund.payer, int(refund.amount)), owner={"refund": refund},
                       purpose=ChainTxPurpose.REFUND, now=now)
    return _refund_broadcast(refund, tx, cause, now)


def _refund_broadcast(refund: RefundObligation, tx: ChainTransaction, cause: Cause, now: datetime) -> RefundResult:
    answer = chain_tx_broadcast(tx, now=now)
    data = {"tx_hash": tx.tx_hash, "answer": answer.detail[:500]}
    event = {"ok": "submit_ok", "rejected": "submit_rejected_definitely"}.get(answer.kind, "submit_timeout")
    result = refund_accept(refund.refund_id, events=[(event, data)], cause=cause, now=now)
    if result.state in SETTLEMENT_TERMINAL:
        chain_tx_record(tx, now=now, terminal=True)
    return result


def refund_query(refund_id: str, *, cause: Cause, now: datetime | None = None) -> RefundResult:
    """One round of evidence about the refund's transaction (or the broadcast a crash missed)."""
    now = now or trusted_now()
    refund = RefundObligation.objects.get(refund_id=refund_id)
    tx = ChainTransaction.objects.select_related("network").filter(refund=refund).first()
    if tx is None:
        return RefundResult(False, refund_id, refund.state, refund.generation, "NOT_PAID", "no refund signed yet")
    if refund.state == "not_started":
        return _refund_broadcast(refund, tx, cause, now)
    if refund.state not in LIVE:
        chain_tx_record(tx, now=now, terminal=True)
        result = RefundResult(False, refund_id, refund.state, refund.generation, "NO_NEW_EVIDENCE", refund.state)
    else:
        evidence = chain_tx_evidence(tx)
        found = steps_for(refund.state, evidence)
        events = list(found.steps)
        if found.rebroadcast:
            answer = chain_tx_broadcast(tx, now=now)
            if refund.state == "unknown":
                events = [("query_found_pending" if answer.kind == "ok" else "query_still_unknown",
                           {"evidence": "rebroadcast", "detail": answer.detail[:500]})]
        done = any(e in ("confirmations_reached", "query_found_confirmed", "reverted", "query_found_failed")
                   for e, _ in events)
        chain_tx_record(tx, now=now, evidence=evidence, terminal=done)
        if not events:
            return RefundResult(False, refund_id, refund.state, refund.generation, "NO_NEW_EVIDENCE",
                                evidence.detail)
        result = refund_accept(refund_id, events=events, cause=cause, now=now)
    if result.state == "confirmed":
        refund_close_intent(refund_id, now=now)
    return result


def refund_close_intent(refund_id: str, *, now: datetime | None = None) -> Outcome | None:
    """A confirmed refund closes its needs-review intent, by the lead who paid it (their reason
    and ticket). None when the intent is not (yet) in needs_review or already closed."""
    refund = RefundObligation.objects.select_related("owner", "intent").get(refund_id=refund_id)
    if refund.state != "confirmed" or refund.intent.state != "needs_review" or refund.owner is None:
        return None
    cause = Cause.person(refund.owner, reason=refund.reason, ticket=refund.ticket)
    return intent_accept(intent_id=refund.intent.intent_id, cause=cause, now=now or trusted_now(), steps=[
        Step("intent", "manual_resolved_failed", {"refund_obligation": "recorded", "refund_id": refund_id,
                                                  "actor_role": "billing_lead"})])


def refunds_open() -> list[RefundObligation]:
    """The refund queue: every obligation not yet confirmed, oldest first."""
    return list(RefundObligation.objects.exclude(state="confirmed").select_related("intent", "owner")
                .order_by("created_at"))
