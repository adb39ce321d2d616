"""Each cycle edge: its guards (with reasons) and the FSM method it calls (SPEC §5).

An edge function runs inside the acceptance transaction with the rows locked. It refuses
through `refuse()` before touching anything, then calls exactly one FSM transition and
writes the payment attempt rows that belong to the edge.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from dunning.acceptance.contract import ContractView, contract_phase, is_ended
from dunning.acceptance.guards import (
    UNPAID_STATUSES,
    EdgeContext,
    fresh_receipt_max_age,
    refuse,
    require_fresh_invoice_receipt,
    require_no_pending_attempt,
    require_profile,
    require_restrictions_not_paused,
    require_retry_allowed,
    require_staff_decision,
)
from dunning.models import AttemptOrigin, CauseKind, FactKind, PaymentAttempt, TransitionReceipt
from dunning.states import (
    ATTEMPT_TRANSITIONS,
    CONFLICT_RESOLUTIONS,
    NO_RETRY_CLASSES,
    AttemptState,
    CycleState,
)
from entitlements.profiles import FULL

S = CycleState


def invoice_digest(provider_invoice_id: str, amount: int, currency: str) -> str:
    return hashlib.sha256(f"{provider_invoice_id}:{amount}:{currency.lower()}".encode()).hexdigest()


def local_idempotency_key(cycle_id: object, attempt_number: int) -> str:
    """Deterministic per cycle and attempt number, so a crash before the key was stored still
    resends under the same key."""
    return f"dunning-{cycle_id}-attempt-{attempt_number}"


def _move_attempt(attempt: PaymentAttempt, to_state: str, ctx: EdgeContext, **fields: object) -> None:
    if to_state not in ATTEMPT_TRANSITIONS[attempt.state]:
        refuse("ATTEMPT_STATE_CONFLICT", f"attempt {attempt.operation_id} cannot go {attempt.state} → {to_state}")
    attempt.state = to_state
    for name, value in fields.items():
        setattr(attempt, name, value)
    if to_state in (AttemptState.SUCCEEDED, AttemptState.FAILED):
        attempt.resolved_at = ctx.now
    attempt.save()


def _failure_from_params(ctx: EdgeContext) -> tuple[str, str, bool]:
    decline_code = ctx.param("decline_code", required=False, default="") or ""
    failure_class = ctx.param("failure_class", required=False) or ctx.spec.failure_class_for(decline_code or None)
    return failure_class, decline_code, failure_class in NO_RETRY_CLASSES


def _record_provider_attempt(ctx: EdgeContext, *, failure_class: str, decline_code: str) -> PaymentAttempt:
    """The provider already tried; record that attempt, never start a charge (SPEC §5)."""
    ref = ctx.param("provider_payment_ref", required=False, default="") or ""
    number = ctx.param("attempt_number", required=False, default=None) or max(ctx.invoice.attempt_count, 1)
    key = f"provider:{ctx.invoice.provider_invoice_id}:{ref or number}"
    attempt, _ = PaymentAttempt.objects.get_or_create(
        idempotency_key=key,
        defaults={
            "cycle": ctx.cycle, "origin": AttemptOrigin.PROVIDER,
            "invoice_digest": invoice_digest(ctx.invoice.provider_invoice_id, ctx.cycle.amount, ctx.cycle.currency),
            "amount": ctx.cycle.amount, "currency": ctx.cycle.currency, "state": AttemptState.FAILED,
            "provider_payment_ref": ref, "decline_code": decline_code, "failure_class": failure_class,
            "created_at": ctx.now, "resolved_at": ctx.now,
        },
    )
    return attempt


def record_failure(ctx: EdgeContext) -> None:
    failure_class, decline_code, no_retry = _failure_from_params(ctx)
    _record_provider_attempt(ctx, failure_class=failure_class, decline_code=decline_code)
    ctx.cycle.record_failure(failure_class=failure_class, decline_code=decline_code, no_retry=no_retry)


def start_grace(ctx: EdgeContext) -> None:
    ctx.cycle.start_grace(now=ctx.now, expires_at=ctx.now + ctx.spec.grace_duration)


def schedule_retry(ctx: EdgeContext) -> None:
    require_retry_allowed(ctx)
    next_at: datetime | None = ctx.param("next_attempt_at", required=False)
    if ctx.spec.retry_authority == "LOCAL" and next_at is None:
        used = ctx.cycle.retry_budget_used
        intervals = ctx.spec.retry_intervals
        next_at = ctx.now + intervals[min(used, len(intervals) - 1)]
    if next_at is None:
        refuse("MISSING_NEXT_ATTEMPT", "provider authority: the provider's next_payment_attempt is the evidence")
    ctx.cycle.schedule_retry(next_attempt_at=next_at)


def reschedule_retry(ctx: EdgeContext) -> None:
    if ctx.spec.retry_authority != "PAYMENT_PROVIDER":
        refuse("RETRY_AUTHORITY_IS_LOCAL", "only provider evidence reschedules; local schedules follow the policy")
    ctx.cycle.reschedule_retry(next_attempt_at=ctx.param("next_attempt_at", required=False))


def prepare_retry(ctx: EdgeContext) -> None:
    if ctx.spec.retry_authority != "LOCAL":
        refuse("RETRY_AUTHORITY_IS_PROVIDER", "the payment provider owns retries under this policy")
    require_no_pending_attempt(ctx)
    require_retry_allowed(ctx)
    number = ctx.cycle.retry_budget_used + 2  # attempt 1 was the renewal charge itself
    attempt = PaymentAttempt.objects.create(
        cycle=ctx.cycle, origin=AttemptOrigin.LOCAL,
        idempotency_key=local_idempotency_key(ctx.cycle.cycle_id, number),
        invoice_digest=invoice_digest(ctx.invoice.provider_invoice_id, ctx.invoice.amount_due, ctx.invoice.currency),
        amount=ctx.invoice.amount_due, currency=ctx.invoice.currency,
        state=AttemptState.PREPARED, created_at=ctx.now,
    )
    ctx.cycle.prepare_retry(attempt=attempt)


def dispatch_retry(ctx: EdgeContext) -> None:
    attempt = ctx.pending_attempt
    if attempt is None or attempt.state != AttemptState.PREPARED:
        refuse("NO_PREPARED_ATTEMPT", "dispatch needs a PREPARED attempt persisted first")
    _move_attempt(attempt, AttemptState.DISPATCHING, ctx, dispatched_at=ctx.now)
    ctx.cycle.dispatch_retry()


def retry_failed(ctx: EdgeContext) -> None:
    if ctx.cause.kind == CauseKind.USER:
        # A person deciding an unknown payment failed (its key past the provider's retention):
        # as for conflicts, the decision must agree with a fresh receipt of the invoice.
        require_staff_decision(ctx)
        require_fresh_invoice_receipt(ctx, UNPAID_STATUSES, "DECISION_CONTRADICTS_RECEIPT")
    failure_class, decline_code, no_retry = _failure_from_params(ctx)
    if ctx.cycle.state == S.RETRY_SCHEDULED:
        if ctx.spec.retry_authority != "PAYMENT_PROVIDER":
            refuse("NOT_DISPATCHED", "a local retry fails only after it was dispatched")
        _record_provider_attempt(ctx, failure_class=failure_class, decline_code=decline_code)
    else:
        attempt = ctx.pending_attempt
        if attempt is None:
            refuse("NO_PENDING_ATTEMPT", "no attempt to resolve")
        _move_attempt(attempt, AttemptState.FAILED, ctx, decline_code=decline_code, failure_class=failure_class)
    ctx.cycle.retry_failed(failure_class=failure_class, decline_code=decline_code, no_retry=no_retry)


def mark_unknown(ctx: EdgeContext) -> None:
    attempt = ctx.pending_attempt
    if attempt is None:
        refuse("NO_PENDING_ATTEMPT", "no dispatched attempt")
    _move_attempt(attempt, AttemptState.UNKNOWN, ctx)
    ctx.cycle.mark_unknown(now=ctx.now)


def assign_unknown_owner(ctx: EdgeContext) -> None:
    owner = ctx.param("owner")
    if owner is None:
        refuse("OWNER_REQUIRED", "name the person who owns this unknown payment")
    ctx.cycle.assign_unknown_owner(owner=owner, now=ctx.now)


def return_to_grace(ctx: EdgeContext) -> None:
    ctx.cycle.return_to_grace()


def expire_grace(ctx: EdgeContext) -> None:
    require_no_pending_attempt(ctx)
    expires = ctx.cycle.grace_expires_at
    if expires is None:
        refuse("GRACE_WITHOUT_EXPIRY", "grace has no expiry on this cycle")
    if ctx.now < expires:
        refuse("GRACE_NOT_EXPIRED", f"grace ends {expires.isoformat()}")
    ctx.cycle.expire_grace()


def _still_owed(ctx: EdgeContext) -> tuple[str, ...]:
    """Invoice statuses that still mean debt. A lost dispute leaves the invoice `paid` at the
    provider while the money went back, so for a reopened cycle `paid` still means owed."""
    return (*UNPAID_STATUSES, "paid") if ctx.cycle.dispute_reopened else UNPAID_STATUSES


def _require_grace_over(ctx: EdgeContext) -> None:
    expires = ctx.cycle.grace_expires_at
    if expires is not None and ctx.now < expires:
        refuse("GRACE_NOT_EXPIRED", f"grace ends {expires.isoformat()}")


def begin_restriction(ctx: EdgeContext) -> None:
    require_restrictions_not_paused(ctx)
    _require_grace_over(ctx)  # the deadline is re-checked here, not trusted from the expiry step
    require_fresh_invoice_receipt(ctx, _still_owed(ctx), "INVOICE_NOT_UNPAID")
    ctx.cycle.begin_restriction()


def complete_restriction(ctx: EdgeContext) -> None:
    ctx.cycle.complete_restriction(now=ctx.now)


def _require_cancel_due(ctx: EdgeContext) -> None:
    due_after = ctx.spec.cancel_after_restricted
    if ctx.spec.cancel_after != "MANUAL_OR_POLICY_TERMINAL" or due_after is None:
        refuse("CANCEL_NOT_DUE", "this policy cancels only by a support decision")
    due = (ctx.cycle.restricted_at or ctx.now) + due_after
    if ctx.now < due:
        refuse("CANCEL_NOT_DUE", f"cancellation is due {due.isoformat()}")


def request_cancellation(ctx: EdgeContext) -> None:
    manual = ctx.cause.kind == CauseKind.USER
    if manual:
        require_staff_decision(ctx)
    else:
        require_restrictions_not_paused(ctx)
        _require_cancel_due(ctx)
    ctx.cycle.request_cancellation(now=ctx.now)


def _requested_by_staff(ctx: EdgeContext) -> bool:
    asked = (TransitionReceipt.objects.filter(cycle=ctx.cycle, edge="request_cancellation", accepted=True)
             .order_by("-pk").values_list("cause_kind", flat=True).first())
    return asked == CauseKind.USER


def cancel(ctx: EdgeContext) -> None:
    if ctx.cause.kind != CauseKind.USER:
        # The incident switch holds CANCEL_PENDING → CANCELED too, and an automatic cancellation
        # re-checks its own deadline (a staff request was its own decision).
        require_restrictions_not_paused(ctx)
        if not _requested_by_staff(ctx):
            _require_cancel_due(ctx)
    require_fresh_invoice_receipt(ctx, _still_owed(ctx), "INVOICE_NOT_UNPAID")
    ctx.cycle.cancel(now=ctx.now)
    _carry_cancellation_to_provider(ctx)


def _carry_cancellation_to_provider(ctx: EdgeContext) -> None:
    """The provider must stop invoicing a customer we told the subscription ended: its
    subscription is canceled through the outbox after commit, under one idempotency key."""
    sub = ctx.subscription
    if is_ended(contract_phase(ContractView.of(sub), ctx.now)):
        ctx.notes.append("contract already ended at the provider; nothing to cancel there")
        return
    if sub.provider_cancel_requested_at is not None:
        return  # asked once already (another cycle of this subscription); that request stands
    sub.provider_cancel_requested_at = ctx.now
    sub.save(update_fields=["provider_cancel_requested_at", "updated_at"])
    key = f"provider-cancel:{sub.pk}"
    ctx.side_effects.append(("provider.cancel_subscription", key, {
        "subscription": sub.pk, "provider_subscription_id": sub.provider_subscription_id,
        "idempotency_key": f"dunning-cancel-{sub.provider_subscription_id}", "cycle": str(ctx.cycle.cycle_id),
    }))
    ctx.notes.append("cancellation requested at the provider")


def _resolve_pending_attempt_as_paid(ctx: EdgeContext) -> None:
    attempt = ctx.pending_attempt
    if attempt is not None and attempt.state in (AttemptState.DISPATCHING, AttemptState.UNKNOWN):
        ref = ctx.param("provider_payment_ref", required=False, default="") or attempt.provider_payment_ref
        _move_attempt(attempt, AttemptState.SUCCEEDED, ctx, provider_payment_ref=ref)


def recover(ctx: EdgeContext) -> None:
    require_fresh_invoice_receipt(ctx, ("paid",), "INVOICE_NOT_PAID")
    _resolve_pending_attempt_as_paid(ctx)
    ctx.cycle.recover(now=ctx.now)


def close_void(ctx: EdgeContext) -> None:
    require_fresh_invoice_receipt(ctx, ("void",), "INVOICE_NOT_VOID")
    ctx.cycle.close_void(now=ctx.now)


def flag_conflict(ctx: EdgeContext) -> None:
    reason = ctx.param("conflict_reason")
    ctx.cycle.flag_conflict(reason=reason, held_profile=ctx.subscription.entitlement_profile)


_RESOLUTION_NEEDS = {S.RECOVERED: ("paid",), S.CLOSED_VOID: ("void",),
                     S.GRACE_ACTIVE: UNPAID_STATUSES, S.RESTRICTED: UNPAID_STATUSES}


def resolve_conflict(ctx: EdgeContext) -> None:
    require_staff_decision(ctx)
    resolution = ctx.param("resolution")
    if resolution not in CONFLICT_RESOLUTIONS:
        refuse("UNKNOWN_RESOLUTION", f"resolve to one of {', '.join(sorted(CONFLICT_RESOLUTIONS))}")
    require_fresh_invoice_receipt(ctx, _RESOLUTION_NEEDS[resolution], "RESOLUTION_CONTRADICTS_RECEIPT")
    if resolution == S.RECOVERED:
        _resolve_pending_attempt_as_paid(ctx)
    ctx.cycle.resolve_conflict(resolution=resolution, now=ctx.now)


def grant_exception(ctx: EdgeContext) -> None:
    require_staff_decision(ctx)
    expires_at: datetime = ctx.param("expires_at")
    owner = (ctx.param("owner", required=False) or "").strip() or ctx.cause.actor
    profile = ctx.param("profile", required=False) or FULL
    require_profile(profile)
    if expires_at is None or expires_at <= ctx.now:
        refuse("EXCEPTION_EXPIRY_NOT_IN_FUTURE", "an exception must expire in the future")
    if expires_at - ctx.now > ctx.spec.exception_max_duration:
        refuse("EXCEPTION_TOO_LONG", f"policy allows at most {ctx.spec.exception_max_duration}")
    ctx.cycle.grant_exception(expires_at=expires_at, owner=owner, reason=ctx.cause.reason,
                              ticket=ctx.cause.ticket, profile=profile)


def expire_exception(ctx: EdgeContext) -> None:
    if ctx.cycle.exception_expires_at and ctx.now < ctx.cycle.exception_expires_at:
        refuse("EXCEPTION_NOT_EXPIRED", f"exception runs until {ctx.cycle.exception_expires_at.isoformat()}")
    ctx.cycle.expire_exception()


def reopen_after_dispute(ctx: EdgeContext) -> None:
    if ctx.spec.dispute_lost != "BLOCKING":
        refuse("DISPUTE_LOST_NOT_BLOCKING", "policy does not reopen debt on a lost dispute")
    if not any(f.kind == FactKind.DISPUTE_LOST for f in ctx.evidence.facts) and not ctx.invoice.facts.filter(
        kind=FactKind.DISPUTE_LOST
    ).exists():
        refuse("DISPUTE_LOST_FACT_REQUIRED", "a lost dispute must be on record first")
    ctx.cycle.reopen_after_dispute()


def revise_draft_amount(ctx: EdgeContext) -> None:
    """A draft invoice may still change (usage lines added before finalization): the cycle takes
    the amount the invoice has when it is finalized, not the one of its first sighting. Once the
    mirror is final, an amount change is not revised here; the caller quarantines it."""
    if ctx.invoice_status_before != "draft":
        refuse("INVOICE_ALREADY_FINAL", f"invoice was {ctx.invoice_status_before or 'unknown'} before this "
                                        "receipt; a final invoice's amount is fixed")
    if ctx.cycle.state != S.CURRENT:
        refuse("EDGE_NOT_ALLOWED", f"a draft's amount is revised only while the cycle is CURRENT, "
                                   f"not {ctx.cycle.state}")
    if ctx.evidence.invoice is None:
        refuse("FRESH_RECEIPT_REQUIRED", "the revised amount comes from a fresh fetch of the invoice")
    ctx.notes.append(f"draft amount {ctx.cycle.amount} → {ctx.invoice.amount_due} {ctx.invoice.currency}")
    ctx.cycle.amount = ctx.invoice.amount_due


def _require_fresh_customer_receipt(ctx: EdgeContext) -> None:
    """The edge needs a fresh provider fetch of this subscription's customer."""
    receipt = ctx.evidence.receipt
    customer_id = ctx.subscription.customer.provider_customer_id
    if receipt is None or receipt.object_type != "customer":
        refuse("CUSTOMER_RECEIPT_REQUIRED", "this edge needs a fresh provider receipt of the customer")
    if receipt.object_id != customer_id:
        refuse("RECEIPT_NOT_FOR_THIS_CUSTOMER", f"receipt is for customer {receipt.object_id}, not {customer_id}")
    age = ctx.now - receipt.fetched_at
    limit = fresh_receipt_max_age()
    if age > limit or age < -limit:
        refuse("RECEIPT_NOT_FRESH", f"receipt fetched {age.total_seconds():.0f}s from trusted now; limit {limit}")


def clear_customer_action(ctx: EdgeContext) -> None:
    """A new default payment method, fetched fresh, answers a hard decline: the customer has acted.
    The same card seen again (or still the declined one) changes nothing."""
    if not ctx.cycle.customer_action_required:
        refuse("NO_CUSTOMER_ACTION_REQUIRED", "this cycle does not wait for the customer")
    _require_fresh_customer_receipt(ctx)
    method = ctx.param("payment_method", required=False) or ""
    declined = ctx.param("declined_payment_method")
    if not method:
        refuse("NO_DEFAULT_PAYMENT_METHOD", "the customer has no default payment method")
    if method == declined:
        refuse("SAME_PAYMENT_METHOD", f"{method} is the payment method that was declined")
    ctx.notes.append(f"new default payment method {method} (declined: {declined})")
    ctx.cycle.clear_customer_action()


def _next_local_slot(ctx: EdgeContext) -> int:
    """Attempt 1 was the renewal charge; each locally dispatched attempt takes the next slot."""
    return 2 + PaymentAttempt.objects.filter(cycle=ctx.cycle, origin=AttemptOrigin.LOCAL).count()


def dispatch_customer_payment(ctx: EdgeContext) -> None:
    """The customer's "Pay now" under provider retry authority: the attempt and its idempotency key
    are committed (DISPATCHING) before the provider is called; the cycle's state stays."""
    if ctx.spec.retry_authority != "PAYMENT_PROVIDER":
        refuse("RETRY_AUTHORITY_IS_LOCAL", "under LOCAL authority the customer's payment is a local retry")
    require_no_pending_attempt(ctx)
    unanswered = PaymentAttempt.objects.filter(cycle=ctx.cycle, origin=AttemptOrigin.LOCAL,
                                               state__in=(AttemptState.DISPATCHING, AttemptState.UNKNOWN)).first()
    if unanswered is not None:  # detached from the cycle by an event, still without its own answer
        refuse("ATTEMPT_PENDING", f"attempt {unanswered.operation_id} is {unanswered.state}")
    if ctx.cycle.customer_action_required:
        refuse("NON_RETRYABLE_NO_RETRY", "the card on file was declined for good; a new payment method first")
    if ctx.invoice.status not in UNPAID_STATUSES:
        refuse("INVOICE_NOT_UNPAID", f"invoice {ctx.invoice.provider_invoice_id} is {ctx.invoice.status}")
    attempt = PaymentAttempt.objects.create(
        cycle=ctx.cycle, origin=AttemptOrigin.LOCAL,
        idempotency_key=local_idempotency_key(ctx.cycle.cycle_id, _next_local_slot(ctx)),
        invoice_digest=invoice_digest(ctx.invoice.provider_invoice_id, ctx.invoice.amount_due, ctx.invoice.currency),
        amount=ctx.invoice.amount_due, currency=ctx.invoice.currency,
        state=AttemptState.DISPATCHING, created_at=ctx.now, dispatched_at=ctx.now,
    )
    ctx.notes.append(f"customer payment {attempt.operation_id} under key {attempt.idempotency_key}")
    ctx.cycle.dispatch_customer_payment(attempt=attempt)


def _customer_attempt(ctx: EdgeContext, *states: str) -> PaymentAttempt:
    operation_id = ctx.param("operation_id")
    attempt = PaymentAttempt.objects.filter(cycle=ctx.cycle, operation_id=operation_id,
                                            origin=AttemptOrigin.LOCAL).first()
    if attempt is None or attempt.state not in states:
        refuse("NO_PENDING_ATTEMPT", f"no {'/'.join(states)} customer payment {operation_id} on this cycle")
    return attempt


def customer_payment_failed(ctx: EdgeContext) -> None:
    attempt = _customer_attempt(ctx, AttemptState.DISPATCHING, AttemptState.UNKNOWN)
    failure_class, decline_code, no_retry = _failure_from_params(ctx)
    ref = ctx.param("provider_payment_ref", required=False, default="") or attempt.provider_payment_ref
    _move_attempt(attempt, AttemptState.FAILED, ctx, decline_code=decline_code, failure_class=failure_class,
                  provider_payment_ref=ref)
    ctx.cycle.customer_payment_failed(attempt=attempt, failure_class=failure_class, decline_code=decline_code,
                                      no_retry=no_retry)


def customer_payment_unknown(ctx: EdgeContext) -> None:
    attempt = _customer_attempt(ctx, AttemptState.DISPATCHING)
    _move_attempt(attempt, AttemptState.UNKNOWN, ctx)
    ctx.cycle.customer_payment_unknown()


def record_evidence(ctx: EdgeContext) -> None:
    """No state change: the receipt and facts are recorded and the aggregate recomputed."""


@dataclass(frozen=True)
class Edge:
    apply: Callable[[EdgeContext], None]
    moves_cycle: bool = True
    notification: str = ""
    time_guarded: bool = False  # its guard compares a deadline with `now`: `now` may not be ahead of the clock
    writes_cycle: bool = False  # moves no state but changes a cycle field, so the generation moves


EDGES: dict[str, Edge] = {
    "record_failure": Edge(record_failure),
    "start_grace": Edge(start_grace, notification="payment_failed"),
    "schedule_retry": Edge(schedule_retry),
    "reschedule_retry": Edge(reschedule_retry),
    "prepare_retry": Edge(prepare_retry),
    "dispatch_retry": Edge(dispatch_retry),
    "retry_failed": Edge(retry_failed),
    "mark_unknown": Edge(mark_unknown),
    "assign_unknown_owner": Edge(assign_unknown_owner),
    "return_to_grace": Edge(return_to_grace),
    "expire_grace": Edge(expire_grace, time_guarded=True),
    "begin_restriction": Edge(begin_restriction, time_guarded=True),
    "complete_restriction": Edge(complete_restriction, notification="access_restricted", time_guarded=True),
    "request_cancellation": Edge(request_cancellation, time_guarded=True),
    "cancel": Edge(cancel, notification="subscription_canceled", time_guarded=True),
    "recover": Edge(recover, notification="payment_recovered"),
    "close_void": Edge(close_void),
    "flag_conflict": Edge(flag_conflict),
    "resolve_conflict": Edge(resolve_conflict),
    "grant_exception": Edge(grant_exception, notification="exception_granted"),
    "expire_exception": Edge(expire_exception, time_guarded=True),
    "reopen_after_dispute": Edge(reopen_after_dispute, notification="payment_failed"),
    "record_evidence": Edge(record_evidence, moves_cycle=False),
    "revise_draft_amount": Edge(revise_draft_amount, moves_cycle=False, writes_cycle=True),
    # The customer's own actions (issue 15): a new card, and "Pay now" under provider authority.
    # Self-loops on the state; each moves the generation.
    "clear_customer_action": Edge(clear_customer_action),
    "dispatch_customer_payment": Edge(dispatch_customer_payment),
    "customer_payment_failed": Edge(customer_payment_failed),
    "customer_payment_unknown": Edge(customer_payment_unknown),
}
