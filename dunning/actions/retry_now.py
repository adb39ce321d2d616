"""The customer's own "pay it now" (SPEC §9, §12), from the customer page, the admin or the API.

- LOCAL retry authority — "Retry payment now": the same path as a scheduled local retry
  (attempt and idempotency key persisted before the provider is called).
- PAYMENT_PROVIDER authority — "Pay now": the open invoice is paid through the provider as the
  customer's own action, with the same discipline: the attempt and its key are committed
  (`dispatch_customer_payment`) before `pay_invoice`; a timeout is UNKNOWN, not a failure, and is
  resolved by asking the provider and resending under the same key, never a second charge. The
  cycle's state (and so access) does not move until the provider shows the invoice paid.

Both are refused in plain words while an attempt is pending or its outcome unknown. What the
customer page offers is decided by `retry_now_blocker` / `pay_now_blocker`, the same checks the
services make, so a button is shown only where it can work.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings

from dunning.acceptance.inputs import Cause, Expect
from dunning.acceptance.transitions import cycle_accept_transition
from dunning.actions.local_retry import (
    CUSTOMER_PAYMENT,
    RetryOutcome,
    attempt_resolve,
    attempt_send,
    retry_dispatch,
)
from dunning.clock import trusted_now
from dunning.models import AttemptOrigin, DunningCycle, PaymentAttempt
from dunning.models.cycle import CUSTOMER_ACTIONABLE_STATES
from dunning.policy.cache import policy_spec
from dunning.reads.cycles import cycle_read
from dunning.states import NO_RETRY_CLASSES, PENDING_ATTEMPT_STATES, AttemptState, CycleState
from subscriptions.providers.base import PaymentProvider
from subscriptions.providers.labels import provider_refusal
from subscriptions.providers.registry import get_provider

S = CycleState
RETRY_NOW_STATES = frozenset({S.GRACE_ACTIVE, S.RETRY_SCHEDULED})
OPEN_ATTEMPT_STATES = (AttemptState.DISPATCHING, AttemptState.UNKNOWN)
UNPAID = ("open", "uncollectible")

# Plain words for each refusal, for customers and support staff alike (no internal codes shown).
REFUSAL_TEXT: dict[str, str] = {
    "ATTEMPT_IN_PROGRESS": "A payment attempt is already in progress. We will not charge you again until we "
                           "know how it ended.",
    "RETRY_AUTHORITY_IS_PROVIDER": "Your card is retried automatically by our payment provider. To pay now, use "
                                   "the payment page.",
    "RETRY_AUTHORITY_IS_LOCAL": "We retry this card ourselves: use \u201cRetry payment now\u201d instead.",
    "NON_RETRYABLE_NO_RETRY": "Your bank declined this card in a way that cannot be retried. Please update your "
                              "payment method.",
    "ATTEMPT_BUDGET_EXHAUSTED": "We have already tried this card as many times as allowed. Please update your "
                                "payment method or contact support.",
    "NOTHING_TO_RETRY": "There is no failed payment to retry on this invoice.",
    "NOTHING_TO_PAY": "There is nothing to pay on this invoice right now.",
}


def _in_flight(cycle: DunningCycle) -> bool:
    pending = cycle.pending_attempt
    return cycle.state in (S.RETRY_DISPATCHING, S.PAYMENT_UNKNOWN) or (
        pending is not None and pending.state in PENDING_ATTEMPT_STATES)


def retry_now_blocker(cycle: DunningCycle) -> str | None:
    """Why "Retry payment now" cannot work on this cycle now (a REFUSAL_TEXT code), or None."""
    spec = policy_spec(cycle.policy)
    if _in_flight(cycle):
        return "ATTEMPT_IN_PROGRESS"
    if spec.retry_authority != "LOCAL":
        return "RETRY_AUTHORITY_IS_PROVIDER"
    if cycle.state not in RETRY_NOW_STATES:
        return "NOTHING_TO_RETRY"
    if cycle.customer_action_required or cycle.failure_class in NO_RETRY_CLASSES:
        return "NON_RETRYABLE_NO_RETRY"
    if 1 + cycle.retry_budget_used >= spec.max_attempts:
        return "ATTEMPT_BUDGET_EXHAUSTED"
    return None


def pay_now_blocker(cycle: DunningCycle) -> str | None:
    """Why "Pay now" cannot work on this cycle now (a REFUSAL_TEXT code), or None. An unknown
    payment of the customer's own is not a blocker: pressing again asks the provider under the
    same key (`cycle_pay_now`)."""
    if policy_spec(cycle.policy).retry_authority != "PAYMENT_PROVIDER":
        return "RETRY_AUTHORITY_IS_LOCAL"
    if (_in_flight(cycle) or open_customer_payment(cycle) is not None) and not customer_payment_unresolved(cycle):
        return "ATTEMPT_IN_PROGRESS"
    if cycle.state not in CUSTOMER_ACTIONABLE_STATES or cycle.invoice.status not in UNPAID:
        return "NOTHING_TO_PAY"
    if cycle.customer_action_required:
        return "NON_RETRYABLE_NO_RETRY"
    return None


def open_customer_payment(cycle: DunningCycle) -> PaymentAttempt | None:
    """The customer's payment on this cycle still without an answer (DISPATCHING or UNKNOWN):
    normally the pending attempt, but also one an event's acceptance detached from the cycle
    (a provider-reported failure clears the pending attempt), which is still resolved the same way."""
    if policy_spec(cycle.policy).retry_authority != "PAYMENT_PROVIDER":
        return None
    pending = cycle.pending_attempt
    if pending is not None and pending.origin == AttemptOrigin.LOCAL and pending.state in OPEN_ATTEMPT_STATES:
        return pending
    return (PaymentAttempt.objects.filter(cycle=cycle, origin=AttemptOrigin.LOCAL, state__in=OPEN_ATTEMPT_STATES)
            .order_by("created_at", "pk").first())


def customer_payment_unresolved(cycle: DunningCycle, now: datetime | None = None) -> PaymentAttempt | None:
    """The customer's payment whose answer never came: UNKNOWN, or DISPATCHING for longer than a
    request takes (the process sending it died). None while one is simply on its way."""
    attempt = open_customer_payment(cycle)
    if attempt is None:
        return None
    if attempt.state == AttemptState.UNKNOWN:
        return attempt
    stale = timedelta(seconds=getattr(settings, "DUNNING_DISPATCH_STALE_SECONDS", 120))
    if attempt.dispatched_at is not None and (now or trusted_now()) - attempt.dispatched_at > stale:
        return attempt
    return None


def customer_payment_resolve(*, cycle_pk: int, cause: Cause, now: datetime | None = None,
                             provider: PaymentProvider | None = None) -> RetryOutcome:
    """Ask the provider how the customer's unanswered payment ended (the invoice, then the same
    request under the same key). For a customer pressing again, and for a job sweeping them."""
    now = now or trusted_now()
    cycle = cycle_read(cycle_pk)
    attempt = customer_payment_unresolved(cycle, now)
    if attempt is None:
        return _refused("ATTEMPT_IN_PROGRESS" if open_customer_payment(cycle) else "NOTHING_TO_PAY",
                        provider=cycle.invoice.provider)
    return attempt_resolve(RetryOutcome("UNKNOWN"), cycle, cause, now, provider or get_provider(cycle.invoice.provider),
                           CUSTOMER_PAYMENT, attempt)


def cycle_retry_now(*, cycle_pk: int, cause: Cause, now: datetime | None = None,
                    provider: PaymentProvider | None = None) -> RetryOutcome:
    now = now or trusted_now()
    cycle = cycle_read(cycle_pk)
    blocker = retry_now_blocker(cycle)
    if blocker is not None:
        return _refused(blocker, provider=cycle.invoice.provider)
    if cycle.state == S.GRACE_ACTIVE:
        scheduled = cycle_accept_transition(cycle_pk=cycle.pk, edge="schedule_retry", expect=Expect.from_cycle(cycle),
                                            cause=cause, params={"next_attempt_at": now}, now=now)
        if not scheduled.accepted:
            return _refused(scheduled.reason, scheduled.detail, provider=cycle.invoice.provider)
    return retry_dispatch(cycle_pk=cycle.pk, cause=cause, now=now, provider=provider)


def cycle_pay_now(*, cycle_pk: int, cause: Cause, now: datetime | None = None,
                  provider: PaymentProvider | None = None) -> RetryOutcome:
    """Pay the cycle's open invoice through the provider, as the customer's own action (provider
    retry authority). Pressed again after an unanswered payment, it asks the provider how that
    payment ended — the invoice, then the same request under the same key — instead of paying again."""
    now = now or trusted_now()
    cycle = cycle_read(cycle_pk)
    provider = provider or get_provider(cycle.invoice.provider)
    if customer_payment_unresolved(cycle, now) is not None:
        return customer_payment_resolve(cycle_pk=cycle_pk, cause=cause, now=now, provider=provider)
    blocker = pay_now_blocker(cycle)
    if blocker is not None:
        return _refused(blocker, provider=cycle.invoice.provider)
    out = RetryOutcome("REFUSED")
    dispatched = cycle_accept_transition(cycle_pk=cycle.pk, edge="dispatch_customer_payment",
                                         expect=Expect.from_cycle(cycle), cause=cause, now=now)
    out.results.append(dispatched)
    if not dispatched.accepted:
        refused = _refused(dispatched.reason, dispatched.detail, provider=cycle.invoice.provider)
        refused.results = out.results
        return refused
    return attempt_send(out, dispatched.cycle, cause, now, provider, CUSTOMER_PAYMENT)


def _refused(code: str, detail: str = "", *, provider: str = "stripe") -> RetryOutcome:
    """The refusal in the words of the customer's provider (an Alipay customer has no card)."""
    text = provider_refusal(provider, code) or REFUSAL_TEXT.get(code, detail or code)
    return RetryOutcome("REFUSED", text, code=code)
