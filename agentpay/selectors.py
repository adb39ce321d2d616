"""Reads: an intent's composite view (API and admin) and the review queue."""

from __future__ import annotations

from typing import Any

from agentpay.composite import NEEDS_REVIEW_STATUSES, display_status_or_violation
from agentpay.models import PaymentIntent
from agentpay.states import Lines


def intent_lines(intent: PaymentIntent) -> Lines:
    settlement = intent.settlements.order_by("-pk").first()
    return Lines(rail=intent.rail, intent=intent.state, settlement=settlement.state,
                 fulfillment=intent.fulfillment.state)


def intent_display_status(intent: PaymentIntent) -> str:
    return display_status_or_violation(intent_lines(intent))  # INVARIANT_VIOLATION: a bug, shown


def intent_composite_view(intent: PaymentIntent) -> dict[str, Any]:
    settlement = intent.settlements.select_related("hold").order_by("-pk").first()
    fulfillment = intent.fulfillment
    status = display_status_or_violation(Lines(rail=intent.rail, intent=intent.state, settlement=settlement.state,
                                               fulfillment=fulfillment.state))
    return {
        "intent_id": intent.intent_id,
        "idempotency_key": intent.idempotency_key,
        "route": intent.route.slug,
        "rail": intent.rail,
        "amount": intent.amount,
        "currency": intent.currency,
        "state": intent.state,
        "generation": intent.generation,
        "display_status": status,
        "needs_review": status in NEEDS_REVIEW_STATUSES or intent.state == "needs_review",
        "settlement": {"settlement_id": settlement.settlement_id, "rail": settlement.rail, "state": settlement.state,
                       "hold_id": settlement.hold.transfer_id if settlement.hold_id else None},
        "fulfillment": {"fulfillment_id": fulfillment.fulfillment_id, "state": fulfillment.state,
                        "upstream_status_code": fulfillment.upstream_status_code,
                        "recovery_deadline": fulfillment.recovery_deadline.isoformat()
                        if fulfillment.recovery_deadline else None},
        "created_at": intent.created_at.isoformat(),
        "updated_at": intent.state_changed_at.isoformat(),
    }
