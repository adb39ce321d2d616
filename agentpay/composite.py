"""The composite view (seed 004 §5): one display status derived from the three lines.

A pure function of (rail, intent, settlement, fulfillment), so the API, the admin and the tests
read the same answer. The seed's table names eight (settlement, fulfillment) pairs; the other
reachable pairs are named in `agentpay/specs/composite-view.md` and the conformance file's
`composite_view`, and this table is written to agree with them (a test compares the two). The
intent's state selects the name only where the pair alone cannot tell (nothing started yet; an
on-chain payment confirmed but not delivered). Three states no history produces have no name:
`display_status` raises UnreachablePair and `display_status_or_violation` says
INVARIANT_VIOLATION (the spec's C12), which is what the API and the admin show.
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
# The spec's names for the pairs the seed's table misses (composite-view.md §2.3).
AWAITING_AUTHORIZATION = "AWAITING_AUTHORIZATION"
PAYMENT_REQUIRED = "PAYMENT_REQUIRED"
AUTHORIZED_SETTLEMENT_NOT_STARTED = "AUTHORIZED_SETTLEMENT_NOT_STARTED"
REJECTED = "REJECTED"
EXPIRED = "EXPIRED"
WALLET_HOLD_CAPTURE_PENDING = "WALLET_HOLD_CAPTURE_PENDING"
WALLET_HOLD_RELEASE_PENDING = "WALLET_HOLD_RELEASE_PENDING"
WALLET_HOLD_NEEDS_REVIEW = "WALLET_HOLD_NEEDS_REVIEW"  # held + unknown: the wallet's needs_review case
SETTLED_AWAITING_FULFILLMENT = "SETTLED_AWAITING_FULFILLMENT"
SETTLED_NOT_FULFILLED_REFUND_REQUIRED = "SETTLED_NOT_FULFILLED_REFUND_REQUIRED"
INVARIANT_VIOLATION = "INVARIANT_VIOLATION"

_CREATED, _AUTH, _REVIEW = "created", "authorized", "needs_review"

# (rail, settlement, fulfillment) → [(intent states, display status)], as in the spec's table.
PAIRS: dict[tuple[str, str, str], list[tuple[tuple[str, ...], str]]] = {
    (WALLET, "not_started", "not_started"): [((_CREATED,), AWAITING_AUTHORIZATION),
                                             ((_AUTH,), AUTHORIZED_SETTLEMENT_NOT_STARTED), (("rejected",), REJECTED),
                                             (("expired",), EXPIRED)],  # authorized, never held (C14)
    (WALLET, "failed", "not_started"): [((_AUTH, "failed"), PAYMENT_FAILED)],
    (WALLET, "held", "not_started"): [((_AUTH,), WALLET_HOLD_PROCESSING)],
    (WALLET, "held", "in_progress"): [((_AUTH,), WALLET_HOLD_PROCESSING)],
    (WALLET, "held", "succeeded"): [((_AUTH, _REVIEW), WALLET_HOLD_CAPTURE_PENDING)],
    (WALLET, "held", "failed"): [((_AUTH, _REVIEW), WALLET_HOLD_RELEASE_PENDING)],
    (WALLET, "held", "unknown"): [((_AUTH, _REVIEW), WALLET_HOLD_NEEDS_REVIEW)],
    (WALLET, "confirmed", "succeeded"): [((_AUTH, "completed", _REVIEW), COMPLETED)],
    (WALLET, "released", "failed"): [((_AUTH, "failed", _REVIEW), RELEASED_UNBILLED)],
    # A never-dispatched hold that expired (hold_expired, the spec's C14).
    (WALLET, "released", "not_started"): [((_AUTH,), RELEASED_UNBILLED), (("expired",), EXPIRED)],
    (ONCHAIN, "not_started", "not_started"): [((_CREATED,), AWAITING_AUTHORIZATION),
                                              (("challenged",), PAYMENT_REQUIRED),
                                              ((_AUTH,), AUTHORIZED_SETTLEMENT_NOT_STARTED),
                                              (("rejected",), REJECTED), (("expired",), EXPIRED)],
    (ONCHAIN, "submitted", "not_started"): [((_AUTH,), SETTLEMENT_IN_PROGRESS)],
    (ONCHAIN, "pending", "not_started"): [((_AUTH, _REVIEW), SETTLEMENT_IN_PROGRESS)],
    (ONCHAIN, "unknown", "not_started"): [((_AUTH, _REVIEW), SETTLEMENT_IN_PROGRESS)],
    (ONCHAIN, "failed", "not_started"): [((_AUTH, "failed", _REVIEW), PAYMENT_FAILED)],
    (ONCHAIN, "confirmed", "not_started"): [((_AUTH, _REVIEW), SETTLED_AWAITING_FULFILLMENT),
                                            (("failed",), SETTLED_NOT_FULFILLED_REFUND_REQUIRED)],
    (ONCHAIN, "confirmed", "in_progress"): [((_AUTH,), FULFILLMENT_IN_PROGRESS)],
    (ONCHAIN, "confirmed", "succeeded"): [((_AUTH, "completed", _REVIEW), COMPLETED)],
    (ONCHAIN, "confirmed", "failed"): [((_AUTH, _REVIEW, "failed"), SETTLED_FULFILLMENT_FAILED_REFUND_REQUIRED)],
    (ONCHAIN, "confirmed", "unknown"): [((_AUTH, _REVIEW), SETTLED_FULFILLMENT_UNKNOWN_NEEDS_REVIEW)],
}

DISPLAY_STATUSES = tuple(dict.fromkeys([status for entries in PAIRS.values() for _, status in entries]
                                       + [INVARIANT_VIOLATION]))

# Display statuses whose money outcome is not known yet: a person may have to look.
NEEDS_REVIEW_STATUSES = frozenset({WALLET_HOLD_NEEDS_REVIEW, SETTLED_FULFILLMENT_UNKNOWN_NEEDS_REVIEW,
                                   SETTLED_FULFILLMENT_FAILED_REFUND_REQUIRED, SETTLED_NOT_FULFILLED_REFUND_REQUIRED})


class UnreachablePair(ValueError):
    """Three states no sequence of accepted transitions produces."""


def display_status(lines: Lines) -> str:
    """The display status of `lines`; UnreachablePair for three states no history produces."""
    for intents, status in PAIRS.get((lines.rail, lines.settlement, lines.fulfillment), ()):
        if lines.intent in intents:
            return status
    raise UnreachablePair(f"no display status for {lines}")


def display_status_or_violation(lines: Lines) -> str:
    try:
        return display_status(lines)
    except UnreachablePair:
        return INVARIANT_VIOLATION
