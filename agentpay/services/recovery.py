"""Resolving what the gateway could not: unknown fulfillments and intents needing review.

An unknown fulfillment is resolved only by the upstream's status query about the same
`ful_…` (never by calling again); past its recovery deadline the intent goes to needs_review
and a billing lead owns it. A lead's resolution (delivered → capture, not delivered → release)
goes through the acceptance service like everything else, with a reason and a ticket.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Count, F, Q

from agentpay.bridge import trusted_now
from agentpay.models import Fulfillment, FulfillmentStatusQuery, IntentReceipt, PaymentIntent, StatusQueryAnswer
from agentpay.services.acceptance import REVIEW_PERMISSION, intent_accept
from agentpay.services.results import Cause, Outcome, Refusal, Step
from agentpay.states import ONCHAIN
from agentpay.upstream import StatusAnswer, upstream_status_query


def _query_steps(answer: StatusAnswer, intent: PaymentIntent, query_id: int | None = None) -> list[Step]:
    """The steps a status-query answer proves; [] when it proves nothing (§9.3)."""
    evidence: dict[str, Any] = {"source": "status_query", "answer": answer.answer, "fenced": answer.fenced}
    if query_id is not None:
        evidence["query_id"] = query_id  # the FulfillmentStatusQuery row this step cites
    # Evidence applies in needs_review too (C04); only the intent waits for a person.
    close = intent.state == "authorized"
    if intent.rail == ONCHAIN:
        # Paid on chain already: nothing to capture or release. Not delivered leaves a refund
        # obligation (the effect writes it) and the intent authorized (C08).
        if answer.answer == "succeeded":
            return [Step("fulfillment", "upstream_status_query_ok", evidence),
                    *([Step("intent", "settlement_confirmed")] if close else [])]
        if answer.answer == "failed" or (answer.answer == "not_found" and answer.fenced):
            return [Step("fulfillment", "upstream_status_query_failed", evidence)]
        return []
    if answer.answer == "succeeded":
        return [Step("fulfillment", "upstream_status_query_ok", evidence), Step("settlement", "capture"),
                *([Step("intent", "settlement_confirmed")] if close else [])]
    if answer.answer == "failed" or (answer.answer == "not_found" and answer.fenced):
        return [Step("fulfillment", "upstream_status_query_failed", evidence), Step("settlement", "release"),
                *([Step("intent", "settlement_released")] if close else [])]
    return []


def status_query_record(*, fulfillment: Fulfillment, answer: StatusAnswer, proves: str,
                        now: datetime) -> FulfillmentStatusQuery:
    """One evidence row per query, conclusive or not (§9.3); and the fulfillment's counters."""
    with transaction.atomic():
        row = FulfillmentStatusQuery.objects.create(
            fulfillment=fulfillment, asked_at=now,
            answer=answer.answer if answer.conclusive else StatusQueryAnswer.INCONCLUSIVE, fenced=answer.fenced,
            http_status=answer.http_status, latency_ms=answer.latency_ms, timed_out=answer.timed_out,
            body_digest=answer.body_digest, error=answer.error, request_id=answer.request_id, proves=proves)
        # Bookkeeping only (not a state): how often and what we asked, for the review queue.
        Fulfillment.objects.filter(pk=fulfillment.pk).update(status_queries=F("status_queries") + 1,
                                                             last_status_query_at=now,
                                                             last_status_query_answer=answer.answer[:64])
    return row


def fulfillment_resolve_by_query(*, intent: PaymentIntent, cause: Cause, now: datetime) -> tuple[str, Outcome | None]:
    """Ask the upstream about this intent's fulfillment (outside any transaction), record the
    answer as evidence, and accept what it proves. Returns (the upstream's answer, the
    acceptance or None when nothing was proven)."""
    fulfillment = intent.fulfillment
    answer = upstream_status_query(route=intent.route, fulfillment_id=fulfillment.fulfillment_id)
    proven = _query_steps(answer, intent)
    row = status_query_record(fulfillment=fulfillment, answer=answer, proves=proven[0].event if proven else "",
                              now=now)
    if not proven:
        return answer.answer, None
    return answer.answer, intent_accept(intent_id=intent.intent_id, steps=_query_steps(answer, intent, row.pk),
                                        cause=cause, now=now)


def intent_pass_recovery_deadline(*, intent: PaymentIntent, cause: Cause, now: datetime) -> Outcome:
    return intent_accept(intent_id=intent.intent_id, cause=cause, now=now, steps=[
        Step("fulfillment", "recovery_deadline_exceeded"), Step("intent", "recovery_deadline_exceeded")])


def review_owner_pick() -> Any | None:
    """The active member of the owner groups with the fewest open reviews (then the lowest id)."""
    users = (get_user_model().objects.filter(is_active=True, groups__name__in=settings.AGENTPAY_REVIEW_OWNER_GROUPS)
             .distinct().annotate(open_reviews=Count("agentpay_reviews", distinct=True,
                                               filter=Q(agentpay_reviews__state="needs_review")))
             .order_by("open_reviews", "pk"))
    return users.first()


def intent_assign_review_owner(*, intent_id: str, owner: Any, cause: Cause, now: datetime | None = None) -> int:
    """Give a needs-review intent its owner; a receipt records who gave it to whom. Returns the
    receipt id. Not a state transition: the three lines do not move."""
    now = now or trusted_now()
    with transaction.atomic(durable=True):
        intent = PaymentIntent.objects.select_for_update().get(intent_id=intent_id)
        if intent.state != "needs_review":
            raise Refusal("NOT_IN_REVIEW", f"{intent_id} is {intent.state}")
        previous = intent.review_owner.get_username() if intent.review_owner_id else ""
        changed = PaymentIntent.objects.filter(pk=intent.pk, generation=intent.generation).update(
            review_owner=owner, review_owner_assigned_at=now, generation=intent.generation + 1)
        if changed != 1:
            raise Refusal("STALE_GENERATION", "the intent changed meanwhile")
        receipt = IntentReceipt.objects.create(
            intent=intent, line="review", event="owner_assigned", accepted=True, from_state=intent.state,
            to_state=intent.state, generation=intent.generation + 1,
            data={"owner": owner.get_username(), "previous_owner": previous}, cause_kind=cause.kind,
            actor=cause.actor, actor_user=cause.user, reason=cause.reason, ticket=cause.ticket, trusted_time=now)
    return receipt.pk


def review_take_ownership(*, intent_id: str, user: Any, reason: str, ticket: str) -> int:
    if not user.has_perm(REVIEW_PERMISSION):
        raise Refusal("NOT_PERMITTED", f"{user.get_username()} may not own AgentPay reviews")
    if not reason.strip() or not ticket.strip():
        raise Refusal("REASON_AND_TICKET_REQUIRED", "taking ownership needs a reason and a ticket")
    return intent_assign_review_owner(intent_id=intent_id, owner=user,
                                      cause=Cause.person(user, reason=reason, ticket=ticket))


def review_resolve(*, intent_id: str, delivered: bool, user: Any, reason: str, ticket: str) -> Outcome:
    """A billing lead's verdict on a needs-review intent (wallet-ledger-spec §9.6, choice C03).

    Delivered: attest `upstream_status_query_ok` (source manual) while the fulfillment is still
    unknown, capture while the hold is still open, then `manual_resolved_confirmed`. Not
    delivered: the same with `upstream_status_query_failed`, release, `manual_resolved_failed`.
    Steps evidence has already taken are skipped; the verdict must agree with what evidence
    proved (a person cannot contradict a terminal state), or the whole action is refused.
    """
    intent = PaymentIntent.objects.select_related("fulfillment").get(intent_id=intent_id)
    settlement = intent.settlements.order_by("-pk").first()
    attest = {"source": "manual", "actor_role": "billing_lead"}
    steps: list[Step] = []
    if intent.fulfillment.state == "unknown":
        steps.append(Step("fulfillment", "upstream_status_query_ok" if delivered else "upstream_status_query_failed",
                          attest))
    if settlement is not None and settlement.state == "held":
        steps.append(Step("settlement", "capture" if delivered else "release"))
    steps.append(Step("intent", "manual_resolved_confirmed" if delivered else "manual_resolved_failed", attest))
    return intent_accept(intent_id=intent_id, steps=steps, cause=Cause.person(user, reason=reason, ticket=ticket),
                         expect_generation=intent.generation)
