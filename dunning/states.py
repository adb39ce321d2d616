"""Cycle states (SPEC §5) and what each asks of the subscription's access (SPEC §7)."""

from __future__ import annotations

from django.db import models

from dunning import state_names as names

# The names are listed once, in dunning.state_names, so the Django-free evaluator shares them.
CycleState = models.TextChoices("CycleState", [(name, name) for name in names.CYCLE_STATES], module=__name__)


S = CycleState

# States whose invoice counts as debt when the policy maps the invoice status as BLOCKING.
DELINQUENT_STATES = frozenset(S(name) for name in names.DELINQUENT_STATES)
# Settled (paid or voided): never blocking, never dunned again.
SETTLED_STATES = frozenset(S(name) for name in names.SETTLED_STATES)
GRACE_PROFILE_STATES = frozenset(
    {
        S.PAYMENT_FAILED, S.GRACE_ACTIVE, S.RETRY_SCHEDULED, S.RETRY_DISPATCHING, S.RETRY_FAILED,
        S.PAYMENT_UNKNOWN, S.GRACE_EXPIRED, S.RESTRICTING,
    }
)
RESTRICTED_PROFILE_STATES = frozenset({S.RESTRICTED, S.CANCEL_PENDING})
# States whose grace ends at `grace_expires_at` whatever the retry schedule says (SPEC §5). An
# attempt in flight (RETRY_DISPATCHING, PAYMENT_UNKNOWN) holds the expiry until it is resolved.
GRACE_DEADLINE_STATES = frozenset({S.GRACE_ACTIVE, S.RETRY_SCHEDULED, S.RETRY_FAILED})
# Terminal: immutable except for appended audit rows (SPEC §2.8).
TERMINAL_STATES = frozenset({S.CANCELED, S.CLOSED_VOID})
# "Any open state" of SPEC §5: everything not terminal and not already settled.
OPEN_STATES = frozenset(set(S) - TERMINAL_STATES - SETTLED_STATES)
# Evidence may move these automatically; EVIDENCE_CONFLICT leaves only by a support decision.
AUTO_SETTLEABLE_STATES = frozenset(OPEN_STATES - {S.EVIDENCE_CONFLICT})
# An exception may suspend only these.
EXCEPTION_SOURCE_STATES = frozenset({S.GRACE_ACTIVE, S.GRACE_EXPIRED, S.RESTRICTED})
# A support decision on a conflict lands on one of these.
CONFLICT_RESOLUTIONS = frozenset({S.RECOVERED, S.CLOSED_VOID, S.GRACE_ACTIVE, S.RESTRICTED})


class AttemptState(models.TextChoices):
    PREPARED = "PREPARED"
    DISPATCHING = "DISPATCHING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    UNKNOWN = "UNKNOWN"


PENDING_ATTEMPT_STATES = frozenset({AttemptState.PREPARED, AttemptState.DISPATCHING, AttemptState.UNKNOWN})
ATTEMPT_TRANSITIONS: dict[str, frozenset[str]] = {
    AttemptState.PREPARED: frozenset({AttemptState.DISPATCHING}),
    AttemptState.DISPATCHING: frozenset({AttemptState.SUCCEEDED, AttemptState.FAILED, AttemptState.UNKNOWN}),
    AttemptState.UNKNOWN: frozenset({AttemptState.SUCCEEDED, AttemptState.FAILED}),
    AttemptState.SUCCEEDED: frozenset(),
    AttemptState.FAILED: frozenset(),
}


class FailureClass(models.TextChoices):
    RETRYABLE = "RETRYABLE"
    TRANSIENT_UNKNOWN = "TRANSIENT_UNKNOWN"
    CUSTOMER_ACTION = "CUSTOMER_ACTION"
    NON_RETRYABLE = "NON_RETRYABLE"


NO_RETRY_CLASSES = frozenset({FailureClass.CUSTOMER_ACTION, FailureClass.NON_RETRYABLE})
