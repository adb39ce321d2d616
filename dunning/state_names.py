"""The cycle states of SPEC §5 as plain strings: the one list of their names.

Django-free on purpose, so the pure review evaluator (:mod:`dunning.reads.verdicts`) can read it;
:mod:`dunning.states` builds the model's ``CycleState`` choices and its state sets from it.
"""

from __future__ import annotations

CURRENT = "CURRENT"
PAYMENT_FAILED = "PAYMENT_FAILED"
GRACE_ACTIVE = "GRACE_ACTIVE"
RETRY_SCHEDULED = "RETRY_SCHEDULED"
RETRY_DISPATCHING = "RETRY_DISPATCHING"
RETRY_FAILED = "RETRY_FAILED"
PAYMENT_UNKNOWN = "PAYMENT_UNKNOWN"
GRACE_EXPIRED = "GRACE_EXPIRED"
RESTRICTING = "RESTRICTING"
RESTRICTED = "RESTRICTED"
CANCEL_PENDING = "CANCEL_PENDING"
CANCELED = "CANCELED"
RECOVERED = "RECOVERED"
CLOSED_VOID = "CLOSED_VOID"
EVIDENCE_CONFLICT = "EVIDENCE_CONFLICT"
EXCEPTION_ACTIVE = "EXCEPTION_ACTIVE"

# In this order they are the model's choices.
CYCLE_STATES = (
    CURRENT, PAYMENT_FAILED, GRACE_ACTIVE, RETRY_SCHEDULED, RETRY_DISPATCHING, RETRY_FAILED, PAYMENT_UNKNOWN,
    GRACE_EXPIRED, RESTRICTING, RESTRICTED, CANCEL_PENDING, CANCELED, RECOVERED, CLOSED_VOID, EVIDENCE_CONFLICT,
    EXCEPTION_ACTIVE,
)
# States whose invoice counts as debt when the policy maps the invoice status as BLOCKING.
DELINQUENT_STATES = frozenset({
    PAYMENT_FAILED, GRACE_ACTIVE, RETRY_SCHEDULED, RETRY_DISPATCHING, RETRY_FAILED, PAYMENT_UNKNOWN,
    GRACE_EXPIRED, RESTRICTING, RESTRICTED, CANCEL_PENDING, CANCELED, EVIDENCE_CONFLICT, EXCEPTION_ACTIVE,
})
# Settled: the debt was paid (RECOVERED) or voided (CLOSED_VOID); a settled cycle never blocks.
SETTLED_STATES = frozenset({RECOVERED, CLOSED_VOID})

# How far along its life a provider invoice is. It only moves forward (draft → open →
# uncollectible → paid / void), so a read that shows it behind what we already hold is an old copy.
INVOICE_STATUS_RANK = {"draft": 0, "open": 1, "uncollectible": 2, "paid": 3, "void": 3}
# The rank of a final invoice (paid, void): no read can be ahead of it.
FINAL_INVOICE_STATUS_RANK = max(INVOICE_STATUS_RANK.values())


def invoice_status_rank(status: str, unknown: int = 0) -> int:
    return INVOICE_STATUS_RANK.get(status, unknown)
