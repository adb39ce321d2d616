""""Retry now" from the customer page, the admin or the API (SPEC §9): the same path as a
scheduled local retry — attempt and idempotency key persisted before the provider is called —
and refused while an attempt is pending or its outcome unknown.
"""

from __future__ import annotations

from datetime import datetime

from dunning.clock import trusted_now
from dunning.policy_cache import policy_spec
from dunning.services.acceptance import cycle_accept_transition
from dunning.services.cycle_reads import cycle_read
from dunning.services.local_retry import RetryOutcome, retry_dispatch
from dunning.services.results import Cause, Expect
from dunning.states import PENDING_ATTEMPT_STATES, CycleState
from subscriptions.providers.base import PaymentProvider

S = CycleState

# Plain words for each refusal, for customers and support staff alike (no internal codes shown).
REFUSAL_TEXT: dict[str, str] = {
    "ATTEMPT_IN_PROGRESS": "A payment attempt is already in progress. We will not charge you again until we "
                           "know how it ended.",
    "RETRY_AUTHORITY_IS_PROVIDER": "Your card is retried automatically by our payment provider. To pay now, use "
                                   "the payment page.",
    "NON_RETRYABLE_NO_RETRY": "Your bank declined this card in a way that cannot be retried. Please update your "
                              "payment method.",
    "ATTEMPT_BUDGET_EXHAUSTED": "We have already tried this card as many times as allowed. Please update your "
                                "payment method or contact support.",
    "NOTHING_TO_RETRY": "There is no failed payment to retry on this invoice.",
}


def cycle_retry_now(*, cycle_pk: int, cause: Cause, now: datetime | None = None,
                    provider: PaymentProvider | None = None) -> RetryOutcome:
    now = now or trusted_now()
    cycle = cycle_read(cycle_pk)
    pending = cycle.pending_attempt
    if cycle.state in (S.RETRY_DISPATCHING, S.PAYMENT_UNKNOWN) or (
            pending is not None and pending.state in PENDING_ATTEMPT_STATES):
        return _refused("ATTEMPT_IN_PROGRESS")
    if policy_spec(cycle.policy).retry_authority != "LOCAL":
        return _refused("RETRY_AUTHORITY_IS_PROVIDER")
    if cycle.state == S.GRACE_ACTIVE:
        scheduled = cycle_accept_transition(cycle_pk=cycle.pk, edge="schedule_retry", expect=Expect.from_cycle(cycle),
                                            cause=cause, params={"next_attempt_at": now}, now=now)
        if not scheduled.accepted:
            return _refused(scheduled.reason, scheduled.detail)
    elif cycle.state != S.RETRY_SCHEDULED:
        return _refused("NOTHING_TO_RETRY")
    return retry_dispatch(cycle_pk=cycle.pk, cause=cause, now=now, provider=provider)


def _refused(code: str, detail: str = "") -> RetryOutcome:
    return RetryOutcome("REFUSED", REFUSAL_TEXT.get(code, detail or code), code=code)
