"""Release-gate constants and the one-line definition of every gate (SPEC §15)."""

from __future__ import annotations

from datetime import timedelta

from dunning.models import EventOutcome

BATCH = 2000  # rows per keyset page / iterator chunk
DETAIL_LIMIT = 5  # offending ids listed per gate
PENDING_LIMIT = timedelta(minutes=10)  # an unprocessed event older than this counts against attribution
OWNER_DEADLINE = timedelta(hours=1)  # PAYMENT_UNKNOWN gets an owner within one hour (SPEC §5)
LATENCY_LIMIT_SECONDS = 60.0  # p99 confirmed payment → compliant recovery (SPEC §15)
RESTRICTING_EDGES = ("begin_restriction", "cancel")
NON_MOVING_EDGES = ("record_evidence",)  # accepted without moving the cycle (generation moves only on an
#                                          invoice change); every other accepted cycle receipt moved it.

ATTRIBUTED_OUTCOMES = (EventOutcome.APPLIED, EventOutcome.NO_CHANGE)
HELD_OR_LEGITIMATE_OUTCOMES = (EventOutcome.QUARANTINED, EventOutcome.IGNORED, EventOutcome.DUPLICATE)

# One line per gate, exactly as implemented (the README copies these).
GATE_DEFINITIONS: dict[str, str] = {
    "event_attribution": (
        "Event attribution rate = OK ÷ N, must be 100 % (N = 0 → 100 %). N = provider events with an outcome "
        "other than PENDING, plus PENDING events received more than 10 min before now. OK = APPLIED/NO_CHANGE "
        "with a subscription attached, or QUARANTINED (attributed and held visibly, no access change), IGNORED "
        "(type not used for dunning) or DUPLICATE. Against: UNATTRIBUTABLE, FAILED, APPLIED/NO_CHANGE without a "
        "subscription, PENDING older than 10 min."
    ),
    "root_consistency": (
        "Root recomputation consistency = subscriptions whose stored outstanding_cycle_root equals the root "
        "recomputed from their delinquent cycles (dunning.acceptance.aggregate.outstanding_root; every mismatch is "
        "confirmed with dunning.acceptance.settlement.compute_aggregate) ÷ all subscriptions; must be 100 %."
    ),
    "duplicate_charges": (
        "Duplicate charges = invoices with more than one distinct non-empty provider_ref among their "
        "PAYMENT_SUCCEEDED facts, or whose cycle has more than one SUCCEEDED payment attempt; must be 0."
    ),
    "full_while_blocking": (
        "Full restoration while a blocking cycle remains = (a) subscriptions whose stored profile or newest "
        "snapshot is FULL while at least one cycle is blocking, the subscription's policy enforces for it "
        "(ENFORCE and in rollout) and the aggregate decision over its cycles is not FULL (so neither a FULL "
        "exception, a conflict holding FULL nor recover_with_remaining_debt explains it), plus (b) FULL "
        "snapshots whose cause receipt's root_after is not the empty root (or that have no cause receipt), "
        "unless the decision recomputed from the cycles as they were at that receipt (state from each cycle's "
        "latest accepted receipt up to it, details from the cycle and invoice history at that generation and "
        "revision, verified by reproducing root_after) is FULL; when the reconstruction cannot reproduce "
        "root_after only the receipt policy's recover_with_remaining_debt excuses it; must be 0."
    ),
    "restriction_without_fresh_receipt": (
        "Automatic restriction or cancellation without a fresh receipt = accepted begin_restriction/cancel "
        "receipts whose cause is not USER and whose evidence receipt is missing, is not an invoice receipt of "
        "that cycle's invoice, was fetched more than DUNNING_FRESH_RECEIPT_MAX_AGE_SECONDS (default 300) from "
        "the receipt's trusted_time, or shows a status other than open/uncollectible (paid allowed only when "
        "the cycle is dispute_reopened); must be 0."
    ),
    "stale_generation_commits": (
        "Stale-generation commits = accepted cycle receipts that moved the cycle (edge not record_evidence, "
        "from a non-terminal state) whose cycle_generation is not above the previous such receipt's on that "
        "cycle (by id) or is not the expected (CAS) generation + 1; plus entitlement snapshots whose "
        "generation is not above the previous snapshot of the subscription ordered by issued_at (then id); "
        "plus subscriptions whose stored entitlement_generation is below their newest snapshot's; must be 0."
    ),
    "payment_to_recovery_p99": (
        "p99 confirmed payment → compliant recovery (nearest rank), must be < 60 s (n = 0 → PASS, 'n/a'). "
        "For each cycle's first accepted 'recover' receipt: start = earliest received_at of an invoice.paid / "
        "invoice.payment_succeeded event for the invoice (ProviderEvent.invoice, or data.object.id for events "
        "with no invoice attached), else the earliest PAYMENT_SUCCEEDED fact's recorded_at; end = the receipt's "
        "trusted_time, and when the receipt left no debt (root_after empty) on an enforcing policy, the later of "
        "that and the issued_at of the first FULL snapshot at or after the receipt's entitlement generation "
        "(none → not restored, latency runs to now). All on the trusted clock; negative spans count as 0. "
        "A recovery with no payment event or fact fails the gate."
    ),
    "unknown_owned_within_1h": (
        "Share of PAYMENT_UNKNOWN with an owner within 1 h, must be 100 % (N = 0 → 100 %). N = accepted "
        "mark_unknown receipts (each entry into PAYMENT_UNKNOWN; start = trusted_time) plus cycles now in "
        "PAYMENT_UNKNOWN with no such receipt (start = unknown_since). OK when an accepted assign_unknown_owner "
        "receipt follows within 1 h, or the cycle's unknown_owner_assigned_at lies within [start, start + 1 h], "
        "or the cycle left PAYMENT_UNKNOWN within 1 h, or start + 1 h is still after now."
    ),
    "blind_retries": (
        "Blind retries = LOCAL payment attempts created while an earlier attempt of the same cycle was in "
        "flight (dispatched at or before the new attempt's created_at — or DISPATCHING/UNKNOWN with no "
        "dispatch time — and not resolved by then), plus LOCAL attempts that share an attempt slot "
        "(cycle + attempt number of the deterministic key dunning-<cycle_id>-attempt-<n>) with an earlier "
        "attempt, or whose key is not the deterministic key of any slot of its cycle; must be 0."
    ),
    "grace_overrun": (
        "Grace overrun = cycles still in GRACE_ACTIVE, RETRY_SCHEDULED or RETRY_FAILED whose grace_expires_at "
        "lies more than one grace_expiry period (60 s) before now, without a PREPARED, DISPATCHING or UNKNOWN "
        "attempt holding the expiry; must be 0. A scheduled provider retry does not hold grace."
    ),
    "ended_contract_access": (
        "Ended-contract access = enforced subscriptions whose contract has ended (status canceled or "
        "incomplete_expired, ended_at passed, or cancel_at_period_end with the period end passed, more than one "
        "contract_deadlines period (60 s) ago) and whose current profile is FULL, plus FULL snapshots issued "
        "after the contract's end; must be 0."
    ),
}
