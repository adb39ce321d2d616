"""The composite view (seed 004 §5): one display status derived from the three lines.

A pure function, so the API, the admin and the tests read the same answer. The seed's table
names eight (settlement, fulfillment) pairs; the rest of the reachable pairs are named here
(marked "ours") and written into the spec by its author. The intent's state is read only where
the pair alone cannot tell (nothing started yet; a person's resolution of an unknown outcome;
the wallet's failed settlement, which is always "too little balance").
"""

from __future__ import annotations

from agentpay.states import ONCHAIN, WALLET, Lines

# The seed's §5 rows.
WALLET_HOLD_PROCESSING = "WALLET_HOLD_PROCESSING"
SETTLEMENT_IN_PROGRESS = "SETTLEMENT_IN_PROGRESS"
FULFILLMENT_IN_PROGRESS = "FULFILLMENT_IN_PROGRESS"
COMPLETED = "COMPLETED"
SETTLED_FULFILLMENT_FAILED_REFUND_REQUIRED = "SETTLED_FULFILLMENT_FAILED_REFUND_REQUIRED"
SETTLED_FULFILLMENT_UNKNOWN_NEEDS_REVIEW = "SETTLED_FULFILLMENT_UNKNOWN_NEEDS_REVIEW"
RELEASED_UNBILLED = "RELEASED_UNBILLED"
PAYMENT_FAILED = "PAYMENT_FAILED"
# Ours: pairs the seed's table does not name.
AWAITING_AUTHORIZATION = "AWAITING_AUTHORIZATION"  # created, nothing started
PAYMENT_REQUIRED = "PAYMENT_REQUIRED"  # on-chain: 402 challenge sent
AUTHORIZED = "AUTHORIZED"  # authorized, settlement not started
REJECTED = "REJECTED"  # policy denied / bad signature
EXPIRED = "EXPIRED"  # challenge or authorization expired
INSUFFICIENT_BALANCE = "INSUFFICIENT_BALANCE"  # wallet failed + not_started: the 402
WALLET_HOLD_FULFILLMENT_UNKNOWN_NEEDS_REVIEW = "WALLET_HOLD_FULFILLMENT_UNKNOWN_NEEDS_REVIEW"  # held + unknown
WALLET_CAPTURE_PENDING = "WALLET_CAPTURE_PENDING"  # held + succeeded: a 2xx seen, capture not yet posted
WALLET_RELEASE_PENDING = "WALLET_RELEASE_PENDING"  # held + failed: a 4xx seen, release not yet posted
SETTLED_AWAITING_FULFILLMENT = "SETTLED_AWAITING_FULFILLMENT"  # on-chain confirmed, not dispatched
SETTLEMENT_UNKNOWN_NEEDS_REVIEW = "SETTLEMENT_UNKNOWN_NEEDS_REVIEW"  # on-chain unknown past the deadline
COMPLETED_MANUALLY_RESOLVED = "COMPLETED_MANUALLY_RESOLVED"  # a lead confirmed delivery of an unknown
RELEASED_UNBILLED_MANUALLY_RESOLVED = "RELEASED_UNBILLED_MANUALLY_RESOLVED"  # a lead confirmed non-delivery

DISPLAY_STATUSES = (
    WALLET_HOLD_PROCESSING, SETTLEMENT_IN_PROGRESS, FULFILLMENT_IN_PROGRESS, COMPLETED,
    SETTLED_FULFILLMENT_FAILED_REFUND_REQUIRED, SETTLED_FULFILLMENT_UNKNOWN_NEEDS_REVIEW, RELEASED_UNBILLED,
    PAYMENT_FAILED, AWAITING_AUTHORIZATION, PAYMENT_REQUIRED, AUTHORIZED, REJECTED, EXPIRED, INSUFFICIENT_BALANCE,
    WALLET_HOLD_FULFILLMENT_UNKNOWN_NEEDS_REVIEW, WALLET_CAPTURE_PENDING, WALLET_RELEASE_PENDING,
    SETTLED_AWAITING_FULFILLMENT, SETTLEMENT_UNKNOWN_NEEDS_REVIEW, COMPLETED_MANUALLY_RESOLVED,
    RELEASED_UNBILLED_MANUALLY_RESOLVED,
)

# Display statuses whose money outcome is not known yet: a person may have to look.
NEEDS_REVIEW_STATUSES = frozenset({
    SETTLED_FULFILLMENT_UNKNOWN_NEEDS_REVIEW, WALLET_HOLD_FULFILLMENT_UNKNOWN_NEEDS_REVIEW,
    SETTLEMENT_UNKNOWN_NEEDS_REVIEW,
})


class UnreachablePair(ValueError):
    """Three states no sequence of accepted transitions produces."""


def display_status(lines: Lines) -> str:
    """The display status of `lines`; UnreachablePair for three states no history produces."""
    intent, s, f = lines.intent, lines.settlement, lines.fulfillment
    nothing_started = {"created": AWAITING_AUTHORIZATION, "challenged": PAYMENT_REQUIRED, "authorized": AUTHORIZED,
                       "rejected": REJECTED, "expired": EXPIRED}
    if s == "not_started" and f == "not_started" and intent in nothing_started:
        return nothing_started[intent]
    if s == "failed" and f == "not_started" and intent == "failed":
        return INSUFFICIENT_BALANCE if lines.rail == WALLET else PAYMENT_FAILED
    if lines.rail == WALLET:
        return _wallet(intent, s, f, lines)
    if lines.rail == ONCHAIN:
        return _onchain(intent, s, f, lines)
    raise UnreachablePair(f"no display status for {lines}")


def _wallet(intent: str, s: str, f: str, lines: Lines) -> str:
    table = {
        ("held", "not_started", "authorized"): WALLET_HOLD_PROCESSING,
        ("held", "in_progress", "authorized"): WALLET_HOLD_PROCESSING,
        ("held", "unknown", "authorized"): WALLET_HOLD_FULFILLMENT_UNKNOWN_NEEDS_REVIEW,
        ("held", "unknown", "needs_review"): WALLET_HOLD_FULFILLMENT_UNKNOWN_NEEDS_REVIEW,
        ("held", "succeeded", "authorized"): WALLET_CAPTURE_PENDING,
        ("held", "failed", "authorized"): WALLET_RELEASE_PENDING,
        ("confirmed", "succeeded", "authorized"): WALLET_CAPTURE_PENDING,  # captured, intent not yet closed
        ("confirmed", "succeeded", "completed"): COMPLETED,
        ("released", "failed", "authorized"): RELEASED_UNBILLED,
        ("released", "failed", "failed"): RELEASED_UNBILLED,
        # A lead's resolution of a needs-review intent: capture or release with fulfillment unknown.
        ("confirmed", "unknown", "needs_review"): SETTLED_FULFILLMENT_UNKNOWN_NEEDS_REVIEW,
        ("confirmed", "unknown", "completed"): COMPLETED_MANUALLY_RESOLVED,
        ("released", "unknown", "needs_review"): WALLET_HOLD_FULFILLMENT_UNKNOWN_NEEDS_REVIEW,
        ("released", "unknown", "failed"): RELEASED_UNBILLED_MANUALLY_RESOLVED,
        ("failed", "not_started", "authorized"): INSUFFICIENT_BALANCE,  # hold_failed, intent not yet closed
    }
    try:
        return table[(s, f, intent)]
    except KeyError:
        raise UnreachablePair(f"no display status for {lines}") from None


def _onchain(intent: str, s: str, f: str, lines: Lines) -> str:
    if f == "not_started" and s in ("submitted", "pending", "unknown"):
        return SETTLEMENT_UNKNOWN_NEEDS_REVIEW if intent == "needs_review" else SETTLEMENT_IN_PROGRESS
    table = {
        ("failed", "not_started", "authorized"): PAYMENT_FAILED,
        ("confirmed", "not_started", "authorized"): SETTLED_AWAITING_FULFILLMENT,
        ("confirmed", "in_progress", "authorized"): FULFILLMENT_IN_PROGRESS,
        ("confirmed", "succeeded", "authorized"): COMPLETED,
        ("confirmed", "succeeded", "completed"): COMPLETED,
        ("confirmed", "failed", "authorized"): SETTLED_FULFILLMENT_FAILED_REFUND_REQUIRED,
        ("confirmed", "unknown", "authorized"): SETTLED_FULFILLMENT_UNKNOWN_NEEDS_REVIEW,
        ("confirmed", "unknown", "needs_review"): SETTLED_FULFILLMENT_UNKNOWN_NEEDS_REVIEW,
        ("confirmed", "unknown", "completed"): COMPLETED_MANUALLY_RESOLVED,
        ("confirmed", "not_started", "needs_review"): SETTLED_AWAITING_FULFILLMENT,
        ("confirmed", "not_started", "completed"): COMPLETED_MANUALLY_RESOLVED,
        ("failed", "not_started", "needs_review"): PAYMENT_FAILED,
    }
    try:
        return table[(s, f, intent)]
    except KeyError:
        raise UnreachablePair(f"no display status for {lines}") from None
