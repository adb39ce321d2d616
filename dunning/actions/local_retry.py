"""Local retries (SPEC §9) for policies whose retry authority is LOCAL.

The attempt's operation id and idempotency key are persisted (PREPARED) and the cycle moved to
RETRY_DISPATCHING in committed transactions *before* the provider is called; the call itself
runs outside any transaction. A timeout or 5xx leaves the attempt UNKNOWN, which is resolved by
asking the provider — the invoice first, then the same request under the same key, which the
provider answers from its idempotency record instead of charging again. A new key is never
minted for an attempt whose outcome is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from dunning.acceptance.guards import STALE_REFUSALS
from dunning.acceptance.inputs import Cause, Evidence, Expect, FactSpec, TransitionResult
from dunning.acceptance.transitions import cycle_accept_transition
from dunning.clock import trusted_now
from dunning.evidence.next_edge import invoice_facts, invoice_update
from dunning.evidence.receipts import receipt_record
from dunning.models import DunningCycle, FactKind, PaymentAttempt
from dunning.reads.cycles import cycle_read
from dunning.states import AttemptState, CycleState
from subscriptions.providers.base import (
    PaymentProvider,
    ProviderDeclined,
    ProviderError,
    ProviderIndeterminate,
    ProviderInvoice,
)
from subscriptions.providers.registry import get_provider

S = CycleState
# Resend under the same key only well inside the provider's key retention (an hour inside it:
# Stripe keeps keys for 24 hours, so within 23). KEY_RESEND_WINDOW is the shortest of them, for
# the alert on unknowns left too long.
KEY_RESEND_MARGIN = timedelta(hours=1)
KEY_RESEND_WINDOW = timedelta(hours=23)
# A paid answer is accepted again after a stale refusal (an event moved the cycle meanwhile).
RECOVER_TRIES = 3


@dataclass
class RetryOutcome:
    status: str  # PAID | DECLINED | UNKNOWN | REFUSED
    detail: str = ""
    results: list[TransitionResult] = field(default_factory=list)
    code: str = ""  # why a REFUSED outcome was refused, as a stable code


def _accept(out: RetryOutcome, cycle_pk: int, edge: str, cause: Cause, now: datetime,
            evidence: Evidence | None = None, **params: object) -> TransitionResult:
    cycle = cycle_read(cycle_pk)
    result = cycle_accept_transition(cycle_pk=cycle_pk, edge=edge, expect=Expect.from_cycle(cycle), cause=cause,
                                     evidence=evidence, params=params, now=now)
    out.results.append(result)
    return result


def retry_dispatch(*, cycle_pk: int, cause: Cause, now: datetime | None = None,
                   provider: PaymentProvider | None = None) -> RetryOutcome:
    """Run one scheduled local retry end to end (or continue one a crash interrupted)."""
    now = now or trusted_now()
    out = RetryOutcome("REFUSED")
    cycle = cycle_read(cycle_pk)
    provider = provider or get_provider(cycle.invoice.provider)
    if cycle.state in (S.RETRY_DISPATCHING, S.PAYMENT_UNKNOWN):
        return retry_resolve(cycle_pk=cycle_pk, cause=cause, now=now, provider=provider)
    if cycle.state != S.RETRY_SCHEDULED:
        out.detail = f"no retry is scheduled (cycle is {cycle.state})"
        return out
    if cycle.pending_attempt is None:
        prepared = _accept(out, cycle_pk, "prepare_retry", cause, now)
        if not prepared.accepted:
            out.detail = prepared.reason
            return out
    dispatched = _accept(out, cycle_pk, "dispatch_retry", cause, now)
    if not dispatched.accepted:
        out.detail = dispatched.reason
        return out
    return _send(out, dispatched.cycle, cause, now, provider)


def retry_resolve(*, cycle_pk: int, cause: Cause, now: datetime | None = None,
                  provider: PaymentProvider | None = None) -> RetryOutcome:
    """Resolve a dispatched or unknown attempt by asking the provider, never by a new attempt."""
    now = now or trusted_now()
    out = RetryOutcome("UNKNOWN")
    cycle = cycle_read(cycle_pk)
    provider = provider or get_provider(cycle.invoice.provider)
    attempt = cycle.pending_attempt
    if cycle.state not in (S.RETRY_DISPATCHING, S.PAYMENT_UNKNOWN) or attempt is None:
        return RetryOutcome("REFUSED", f"nothing to resolve (cycle is {cycle.state})")
    return attempt_resolve(out, cycle, cause, now, provider, LOCAL_RETRY)


def attempt_resolve(out: RetryOutcome, cycle: DunningCycle, cause: Cause, now: datetime, provider: PaymentProvider,
                    path: AttemptPath, attempt: PaymentAttempt | None = None) -> RetryOutcome:
    """Ask the provider how an attempt (by default the cycle's pending one) ended: the invoice
    first, then the same request under the same key (inside the key's retention), never a new
    attempt."""
    attempt = attempt or cycle.pending_attempt
    try:
        inv = provider.fetch_invoice(cycle.invoice.provider_invoice_id)
    except ProviderIndeterminate as exc:
        return _unknown(out, cycle, cause, now, f"provider query failed: {exc}", path, attempt)
    if inv.status == "paid":
        return _paid(out, cycle, inv, cause, now)
    if attempt.dispatched_at and now - attempt.dispatched_at > provider.idempotency_retention - KEY_RESEND_MARGIN:
        return _unknown(out, cycle, cause, now, "idempotency key past its retention window; a person must decide",
                        path, attempt)
    if path is LOCAL_RETRY:
        return _send(out, cycle, cause, now, provider)  # (the simulation instruments this name)
    return attempt_send(out, cycle, cause, now, provider, path, attempt)


@dataclass(frozen=True)
class AttemptPath:
    """How an answered attempt is accepted: a scheduled local retry moves the cycle through
    RETRY_FAILED / PAYMENT_UNKNOWN; the customer's own payment ("Pay now") leaves the cycle's
    state alone and records the answer on its attempt."""

    failed_edge: str
    unknown_edge: str
    names_attempt: bool  # the edges are told which attempt (its operation id) they resolve
    after_decline: tuple[str, ...] = ()  # asked once a decline was accepted


LOCAL_RETRY = AttemptPath("retry_failed", "mark_unknown", names_attempt=False,
                          # back to grace, then the policy's next interval unless the budget is spent or the
                          # decline was hard (the schedule_retry guard says which)
                          after_decline=("return_to_grace", "schedule_retry"))
CUSTOMER_PAYMENT = AttemptPath("customer_payment_failed", "customer_payment_unknown", names_attempt=True)


def _send(out: RetryOutcome, cycle: DunningCycle, cause: Cause, now: datetime,
          provider: PaymentProvider) -> RetryOutcome:
    return attempt_send(out, cycle, cause, now, provider, LOCAL_RETRY)


def attempt_send(out: RetryOutcome, cycle: DunningCycle, cause: Cause, now: datetime, provider: PaymentProvider,
                 path: AttemptPath, attempt: PaymentAttempt | None = None) -> RetryOutcome:
    """Send an attempt (by default the cycle's pending one; committed DISPATCHING or UNKNOWN)
    under its own key and accept the answer. A resend under the same key is answered from the
    provider's idempotency record, never charged again."""
    attempt = attempt or cycle.pending_attempt
    try:
        paid = provider.pay_invoice(cycle.invoice.provider_invoice_id, idempotency_key=attempt.idempotency_key)
    except ProviderDeclined as declined:
        return _declined(out, cycle, declined, cause, now, provider, path, attempt)
    except ProviderIndeterminate as exc:
        return _unknown(out, cycle, cause, now, f"no definite answer: {exc}", path, attempt)
    except ProviderError as exc:
        # A definite refusal of the request (e.g. the invoice is already paid or void): the invoice says why.
        try:
            inv = provider.fetch_invoice(cycle.invoice.provider_invoice_id)
        except ProviderIndeterminate:
            return _unknown(out, cycle, cause, now, f"request refused ({exc}) and the invoice could not be fetched",
                            path, attempt)
        if inv.status == "paid":
            return _paid(out, cycle, inv, cause, now)
        return _unknown(out, cycle, cause, now, f"provider refused the request: {exc}", path, attempt)
    try:
        inv = provider.fetch_invoice(cycle.invoice.provider_invoice_id)
    except ProviderIndeterminate:
        inv = paid.invoice
    return _paid(out, cycle, inv, cause, now, payment_ref=paid.payment_ref)


def _receipt(cycle: DunningCycle, inv: ProviderInvoice):  # noqa: ANN202
    return receipt_record(object_type="invoice", body=inv.raw, invoice=cycle.invoice, account=inv.account,
                          fetched_at=trusted_now())


def _paid(out: RetryOutcome, cycle: DunningCycle, inv: ProviderInvoice, cause: Cause, now: datetime,
          payment_ref: str = "") -> RetryOutcome:
    evidence = Evidence(receipt=_receipt(cycle, inv), invoice=invoice_update(inv),
                        facts=invoice_facts(inv, decline_code="", now=now))
    ref = payment_ref or (inv.payment_refs[-1] if inv.payment_refs else "")
    for _ in range(RECOVER_TRIES):
        result = _accept(out, cycle.pk, "recover", cause, now, evidence, provider_payment_ref=ref)
        if result.accepted:
            break
        # The provider's own webhook may have recovered the cycle from the same payment while we
        # waited for the answer: that is this payment, not a refusal of it.
        if cycle_read(cycle.pk).state == S.RECOVERED or result.reason not in STALE_REFUSALS:
            break
    recovered = result.accepted or cycle_read(cycle.pk).state == S.RECOVERED
    out.status = "PAID" if recovered else "REFUSED"
    out.detail = "" if recovered else result.reason
    return out


def _declined(out: RetryOutcome, cycle: DunningCycle, declined: ProviderDeclined, cause: Cause, now: datetime,
              provider: PaymentProvider, path: AttemptPath = LOCAL_RETRY,
              attempt: PaymentAttempt | None = None) -> RetryOutcome:
    attempt = attempt or cycle.pending_attempt
    try:
        inv = provider.fetch_invoice(cycle.invoice.provider_invoice_id)
        evidence = Evidence(receipt=_receipt(cycle, inv), invoice=invoice_update(inv), facts=(
            FactSpec(FactKind.PAYMENT_FAILED, cycle.invoice.amount_due, cycle.invoice.currency,
                     f"failed:{cycle.invoice.provider_invoice_id}:{attempt.idempotency_key}", now,
                     provider_ref=declined.payment_ref, decline_code=declined.decline_code),))
    except ProviderIndeterminate:
        evidence = Evidence()
    named = {"operation_id": attempt.operation_id} if path.names_attempt else {}
    failed = _accept(out, cycle.pk, path.failed_edge, cause, now, evidence, decline_code=declined.decline_code,
                     provider_payment_ref=declined.payment_ref, **named)
    out.status = "DECLINED" if failed.accepted else "REFUSED"
    out.detail = declined.decline_code
    if failed.accepted:
        for edge in path.after_decline:
            _accept(out, cycle.pk, edge, cause, now)
    return out


def _unknown(out: RetryOutcome, cycle: DunningCycle, cause: Cause, now: datetime, why: str,
             path: AttemptPath = LOCAL_RETRY, attempt: PaymentAttempt | None = None) -> RetryOutcome:
    out.status = "UNKNOWN"
    out.detail = why
    attempt = attempt or cycle.pending_attempt
    if attempt is None or attempt.state != AttemptState.DISPATCHING:
        return out
    if path.names_attempt:
        _accept(out, cycle.pk, path.unknown_edge, cause, now, operation_id=attempt.operation_id)
    elif cycle.state == S.RETRY_DISPATCHING:
        _accept(out, cycle.pk, path.unknown_edge, cause, now)
    return out
