"""Processing one inbox event (SPEC §8): attribute it, fetch the provider's current objects,
store receipts, derive facts from the receipts, and reconcile the cycle through acceptance.

The event body only says *which* objects to look at; what they are is always fetched.
"""

from __future__ import annotations

import logging
import traceback
from datetime import datetime

from django.db.models import Max
from django.db.models.functions import Coalesce

from dunning.acceptance.deadlocks import retry_on_deadlock
from dunning.acceptance.inputs import Cause, Evidence, Expect, FactSpec
from dunning.acceptance.opening import InvoiceFacts, OpeningRefused, cycle_open_for_invoice
from dunning.acceptance.transitions import cycle_accept_transition
from dunning.clock import trusted_now
from dunning.evidence.next_edge import cycle_reconcile_with_invoice, invoice_update
from dunning.evidence.outcome_writes import event_outcome_record
from dunning.evidence.payment_methods import payment_method_event
from dunning.evidence.processing_result import Processing
from dunning.evidence.receipts import receipt_record
from dunning.evidence.subscription_import import ContractRefused, subscription_import
from dunning.models import (
    DunningCycle,
    EventOutcome,
    FactKind,
    MonetaryFact,
    PaymentAttempt,
    ProviderEvent,
    ProviderReceipt,
)
from dunning.reads.cycles import cycle_read_for_invoice
from dunning.state_names import FINAL_INVOICE_STATUS_RANK, invoice_status_rank
from dunning.states import CycleState
from subscriptions.models import Subscription
from subscriptions.providers.base import (
    EventKind,
    EventSubject,
    PaymentProvider,
    ProviderIndeterminate,
    ProviderInvoice,
    ProviderNotFound,
)
from subscriptions.providers.registry import get_provider

log = logging.getLogger(__name__)
FAILED_PAYMENT_STATUSES = {"failed", "requires_payment_method", "canceled"}


class EventNotFinished(Exception):
    """The provider could not be asked (indeterminate); the event stays pending for a retry."""


def event_process(*, event_pk: int, now: datetime | None = None) -> str:
    """Process one inbox event once. Safe to call again: a processed event is left alone."""
    event = ProviderEvent.objects.get(pk=event_pk)
    if event.processed_at is not None:
        return event.outcome
    now = now or trusted_now()
    provider = get_provider(event.provider)
    try:
        result = _process(event, provider, now)
    except ProviderIndeterminate as exc:
        event.attempts += 1
        event.error = f"provider did not answer: {exc}"
        event.save(update_fields=["attempts", "error"])
        raise EventNotFinished(str(exc)) from exc
    except Exception:
        event.attempts += 1
        event.error = traceback.format_exc()[-4000:]
        event.outcome = EventOutcome.FAILED
        event.save(update_fields=["attempts", "error", "outcome"])
        raise
    event.outcome = result.outcome
    event.outcome_detail = "; ".join(result.detail)[:4000]
    event.subscription = result.subscription
    event.invoice = result.invoice
    event.cycle = result.cycle
    event.processed_at = now
    event.attempts += 1
    event.error = ""
    retry_on_deadlock(lambda: event_outcome_record(event), what=f"recording the outcome of event {event.event_id}")
    return result.outcome


def _process(event: ProviderEvent, provider: PaymentProvider, now: datetime) -> Processing:
    p = Processing()
    expected_account = provider.account
    if event.account and expected_account and event.account != expected_account:
        return p.finish(EventOutcome.QUARANTINED, f"event for account {event.account}, expected {expected_account}")
    # The adapter reads its own event vocabulary; from here on the event is one of the product's kinds.
    subject = provider.event_subject(event.event_type, event.payload)
    cause = Cause.event(event.event_id)
    if subject.kind == EventKind.SUBSCRIPTION:
        return _subscription_event(p, event, provider, subject.object_id, cause, now)
    if subject.kind == EventKind.PAYMENT_METHOD:
        return payment_method_event(p, event, provider, cause, now)
    if subject.kind == EventKind.INVOICE:
        return _invoice_evidence(p, event, provider, subject.object_id, cause, now, says_paid=subject.says_paid)
    if subject.kind == EventKind.PAYMENT:
        return _payment_event(p, event, provider, subject, cause, now)
    if subject.kind == EventKind.DISPUTE:
        return _dispute_event(p, event, provider, subject.object_id, cause, now)
    return p.finish(EventOutcome.IGNORED, subject.detail or f"event type {event.event_type} is not used for dunning")


def _subscription_event(p: Processing, event: ProviderEvent, provider: PaymentProvider, sub_id: str, cause: Cause,
                        now: datetime) -> Processing:
    try:
        remote = provider.fetch_subscription(sub_id)
    except ProviderNotFound:
        return p.finish(EventOutcome.QUARANTINED, f"provider has no subscription {sub_id}")
    try:
        intake = subscription_import(remote, cause=cause, now=now, fetched_at=trusted_now(), event=event,
                                     provider=provider)
    except ContractRefused as refused:
        p.subscription = Subscription.objects.filter(provider=provider.name, provider_subscription_id=sub_id).first()
        return p.finish(EventOutcome.QUARANTINED, f"contract not applied: {refused.code}: {refused.detail}")
    p.subscription = intake.subscription
    if intake.created:
        return p.finish(EventOutcome.APPLIED, "imported with its first snapshot")
    result = intake.result
    if result is None or not result.accepted:
        return p.finish(EventOutcome.NO_CHANGE, f"contract_update refused: {result.reason if result else '?'}")
    return p.finish(EventOutcome.APPLIED if intake.changed else EventOutcome.NO_CHANGE,
                    f"provider status {remote.status}; {result.detail}")


def _invoice_evidence(p: Processing, event: ProviderEvent | None, provider: PaymentProvider, invoice_id: str,
                      cause: Cause, now: datetime, *, payment_ref: str = "",
                      extra_facts: tuple[FactSpec, ...] = (), says_paid: bool = False) -> Processing:
    try:
        inv = provider.fetch_invoice(invoice_id)
    except ProviderNotFound:
        return p.finish(EventOutcome.QUARANTINED, f"provider has no invoice {invoice_id}")
    stale = invoice_read_is_stale(inv)
    if stale:
        raise ProviderIndeterminate(stale)  # an old copy would move the mirror back; asked again later
    if says_paid and inv.status != "paid":
        # A paid invoice never becomes unpaid again, so this read predates the event (a lagging
        # replica or cache). The event's body is not evidence, but it says when to ask again:
        # the event stays pending and is retried, instead of waiting for grace expiry to notice.
        raise ProviderIndeterminate(f"{event.event_type} for {invoice_id} but the provider's invoice still reads "
                                    f"{inv.status}: a stale read; asking again later")
    fetched_at = trusted_now()
    if not inv.subscription_id:
        receipt_record(object_type="invoice", body=inv.raw, account=inv.account, fetched_at=fetched_at,
                       cause_event=event, provider=provider.name)
        return p.finish(EventOutcome.UNATTRIBUTABLE, f"invoice {invoice_id} belongs to no subscription")
    existing = cycle_read_for_invoice(provider.name, inv.id)
    sub = _subscription_of(provider.name, inv, existing)
    if sub is None:
        try:
            sub = subscription_import(provider.fetch_subscription(inv.subscription_id), cause=cause, now=now,
                                      event=event, provider=provider).subscription
        except ContractRefused as refused:
            return p.finish(EventOutcome.QUARANTINED, f"subscription {inv.subscription_id} not imported: "
                                                      f"{refused.code}: {refused.detail}")
        p.detail.append(f"imported subscription {inv.subscription_id}")
        existing = cycle_read_for_invoice(provider.name, inv.id)  # as the import left it
    p.subscription = sub
    if sub.provider_account and inv.account and sub.provider_account != inv.account:
        return p.finish(EventOutcome.QUARANTINED, f"subscription belongs to {sub.provider_account}")
    try:
        cycle = existing or _cycle_open(sub, inv, cause, now)
    except OpeningRefused as refused:
        receipt_record(object_type="invoice", body=inv.raw, account=inv.account, fetched_at=fetched_at,
                       cause_event=event, provider=provider.name)
        return p.finish(EventOutcome.QUARANTINED, f"no cycle opened for invoice {inv.id}: {refused.code}: "
                                                  f"{refused.detail}")
    p.invoice, p.cycle = cycle.invoice, cycle
    receipt = receipt_record(object_type="invoice", body=inv.raw, invoice=cycle.invoice, account=inv.account,
                             fetched_at=fetched_at, cause_event=event, provider=provider.name)
    if cycle.invoice.status == "draft" and cycle.state == CycleState.CURRENT and inv.amount_due != cycle.amount:
        cycle = _revise_draft_amount(p, cycle, inv, receipt, cause, fetched_at)
    mismatch = _amount_mismatch(cycle, inv)
    if mismatch:
        return p.finish(EventOutcome.QUARANTINED, mismatch)
    decline_code = _latest_decline_code(provider, inv)
    if payment_ref and _contradicts_recorded_success(provider, payment_ref):
        result = _flag_conflict(cycle, receipt, cause, now, f"payment {payment_ref} was recorded as succeeded, "
                                                             f"and a fresh fetch now shows it failed")
        return p.finish(EventOutcome.APPLIED if result.accepted else EventOutcome.NO_CHANGE,
                        f"evidence conflict: {result.reason or 'flagged'}")
    results = cycle_reconcile_with_invoice(cycle_pk=cycle.pk, inv=inv, receipt=receipt, decline_code=decline_code,
                                           cause=cause, now=fetched_at, extra_facts=extra_facts, cycle=cycle)
    accepted = [r for r in results if r.accepted]
    refused = [f"{r.edge} refused: {r.reason}" for r in results if not r.accepted]
    p.detail.extend([f"{r.edge}: {r.from_state}→{r.to_state}" for r in accepted] + refused)
    return p.finish(EventOutcome.APPLIED if accepted else EventOutcome.NO_CHANGE,
                    "" if results else f"cycle already agrees with invoice {inv.status}")


def _subscription_of(provider: str, inv: ProviderInvoice, cycle: DunningCycle | None) -> Subscription | None:
    """The invoice's subscription: the one its cycle's read brought along (the usual case, no
    second read of the row), else looked up by the provider's id."""
    if cycle is not None and (cycle.subscription.provider, cycle.subscription.provider_subscription_id) == (
            provider, inv.subscription_id):
        return cycle.subscription
    return Subscription.objects.filter(provider=provider, provider_subscription_id=inv.subscription_id).first()


def _cycle_open(sub: Subscription, inv: ProviderInvoice, cause: Cause, now: datetime) -> DunningCycle:
    return cycle_open_for_invoice(
        subscription_pk=sub.pk, cause=cause, now=now,
        invoice=InvoiceFacts(provider_invoice_id=inv.id, amount_due=inv.amount_due, currency=inv.currency,
                             status=inv.status, amount_paid=0, attempt_count=0, next_payment_attempt=None,
                             period_start=inv.period_start, period_end=inv.period_end,
                             hosted_invoice_url=inv.hosted_invoice_url, price_ids=tuple(inv.price_ids)),
    )


def _revise_draft_amount(p: Processing, cycle: DunningCycle, inv: ProviderInvoice, receipt, cause: Cause,  # noqa: ANN001
                         now: datetime) -> DunningCycle:
    """A draft's amount is not final: the cycle follows it until the invoice is finalized."""
    current = DunningCycle.objects.select_related("invoice", "subscription", "pending_attempt").get(pk=cycle.pk)
    result = cycle_accept_transition(cycle_pk=cycle.pk, edge="revise_draft_amount", expect=Expect.from_cycle(current),
                                     cause=cause, evidence=Evidence(receipt=receipt, invoice=invoice_update(inv)),
                                     now=now)
    p.detail.append(f"revise_draft_amount: {'accepted' if result.accepted else result.reason}")
    return result.cycle if result.accepted else current


def _amount_mismatch(cycle: DunningCycle, inv: ProviderInvoice) -> str:
    if inv.currency != cycle.currency:
        return (f"currency changed after the invoice was final: cycle holds {cycle.currency}, "
                f"provider shows {inv.currency}")
    if inv.amount_due != cycle.amount:
        return (f"amount due changed after the invoice was final: cycle holds {cycle.amount} {cycle.currency}, "
                f"provider shows {inv.amount_due} {inv.currency}")
    return ""


def _latest_decline_code(provider: PaymentProvider, inv: ProviderInvoice) -> str:
    if inv.status not in ("open", "uncollectible") or not inv.payment_refs:
        return ""
    return provider.fetch_payment(inv.payment_refs[-1]).decline_code


def _contradicts_recorded_success(provider: PaymentProvider, payment_ref: str) -> bool:
    if not MonetaryFact.objects.filter(kind=FactKind.PAYMENT_SUCCEEDED, provider_ref=payment_ref).exists():
        return False
    return provider.fetch_payment(payment_ref).status in FAILED_PAYMENT_STATUSES


def _flag_conflict(cycle: DunningCycle, receipt, cause: Cause, now: datetime, reason: str):  # noqa: ANN001
    fresh = DunningCycle.objects.select_related("invoice", "subscription", "pending_attempt").get(pk=cycle.pk)
    if fresh.state == CycleState.EVIDENCE_CONFLICT:
        return cycle_accept_transition(cycle_pk=cycle.pk, edge="record_evidence", expect=Expect.from_cycle(fresh),
                                       cause=cause, evidence=Evidence(receipt=receipt), now=now)
    return cycle_accept_transition(cycle_pk=cycle.pk, edge="flag_conflict", expect=Expect.from_cycle(fresh),
                                   cause=cause, evidence=Evidence(receipt=receipt),
                                   params={"conflict_reason": reason}, now=now)


def _invoice_for_payment(provider: PaymentProvider, refs: list[str]) -> str | None:
    """Which invoice a payment belongs to: what we recorded first, else what the provider says."""
    refs = [r for r in refs if r]
    fact = MonetaryFact.objects.filter(provider_ref__in=refs).select_related("invoice").first()
    if fact is not None:
        return fact.invoice.provider_invoice_id
    attempt = PaymentAttempt.objects.filter(provider_payment_ref__in=refs).select_related("cycle__invoice").first()
    if attempt is not None:
        return attempt.cycle.invoice.provider_invoice_id
    for ref in refs:
        try:
            invoice_id = provider.invoice_for_payment(ref)
        except ProviderNotFound:
            continue
        if invoice_id:
            return invoice_id
    return None


def _payment_event(p: Processing, event: ProviderEvent, provider: PaymentProvider, subject: EventSubject,
                   cause: Cause, now: datetime) -> Processing:
    payment_id = subject.object_id
    invoice_id = _invoice_for_payment(provider, list(subject.payment_refs or (payment_id,)))
    if invoice_id is None:
        return p.finish(EventOutcome.UNATTRIBUTABLE, f"payment {payment_id} is not linked to any invoice we know")
    _refuse_stale_invoice_read(provider, invoice_id, must_be_paid=subject.says_refunded)
    extra: tuple[FactSpec, ...] = ()
    if subject.says_refunded:
        payment = provider.fetch_payment(payment_id)
        receipt_record(object_type=payment.object or "charge", body=payment.raw, fetched_at=trusted_now(),
                       cause_event=event, provider=provider.name)
        # The fetched charge shows its cumulative refunded total. The fact is offered with that
        # total (one dedupe key per total); the acceptance turns it into the increment over the
        # refunds on record, under the invoice's lock. A total already covered is not offered at all.
        on_record = (MonetaryFact.objects.filter(kind=FactKind.REFUNDED, provider_ref=payment.id)
                     .aggregate(total=Max(Coalesce("cumulative_amount", "amount")))["total"] or 0)
        if payment.amount_refunded > on_record:
            extra = (FactSpec(FactKind.REFUNDED, payment.amount_refunded, payment.currency,
                              f"refund:{payment.id}:{payment.amount_refunded}", now, provider_ref=payment.id),)
    return _invoice_evidence(p, event, provider, invoice_id, cause, now,
                             payment_ref=payment_id if subject.says_payment_failed else "", extra_facts=extra)


def _dispute_event(p: Processing, event: ProviderEvent, provider: PaymentProvider, dispute_id: str, cause: Cause,
                   now: datetime) -> Processing:
    dispute = provider.fetch_dispute(dispute_id)
    receipt_record(object_type="dispute", body=dispute.raw, fetched_at=trusted_now(), cause_event=event,
                   provider=provider.name)
    refs = [dispute.payment_ref, dispute.raw.get("charge") or "", dispute.raw.get("payment_intent") or ""]
    invoice_id = _invoice_for_payment(provider, [r if isinstance(r, str) else r.get("id", "") for r in refs])
    if invoice_id is None:
        return p.finish(EventOutcome.UNATTRIBUTABLE, f"dispute {dispute_id} is not linked to any invoice we know")
    _refuse_stale_invoice_read(provider, invoice_id, must_be_paid=True)  # a disputed charge paid its invoice
    if dispute.status == "lost":
        fact = FactSpec(FactKind.DISPUTE_LOST, dispute.amount, dispute.currency, f"dispute_lost:{dispute.id}", now,
                        provider_ref=dispute.payment_ref)
    elif dispute.status == "won":
        fact = FactSpec(FactKind.DISPUTE_WON, dispute.amount, dispute.currency, f"dispute_won:{dispute.id}", now,
                        provider_ref=dispute.payment_ref)
    else:
        fact = FactSpec(FactKind.DISPUTE_OPENED, dispute.amount, dispute.currency, f"dispute_opened:{dispute.id}",
                        now, provider_ref=dispute.payment_ref)
    # The money the dispute moved, as the fetched dispute's balance transactions show it (a
    # withdrawal is negative, a reinstatement positive; fees are the provider's, not the
    # customer's money). Whichever dispute event arrives records every movement seen so far, once
    # per balance transaction, so a lost `funds_withdrawn` delivery is made up by the next event.
    funds: list[FactSpec] = []
    for movement in dispute.raw.get("balance_transactions") or []:
        if not isinstance(movement, dict) or not movement.get("id") or not int(movement.get("amount") or 0):
            continue
        amount = int(movement["amount"])
        kind = FactKind.DISPUTE_FUNDS_WITHDRAWN if amount < 0 else FactKind.DISPUTE_FUNDS_REINSTATED
        funds.append(FactSpec(kind, abs(amount), (movement.get("currency") or dispute.currency).lower(),
                              f"dispute_funds:{dispute.id}:{movement['id']}", now, provider_ref=dispute.payment_ref))
    facts = (fact, *funds)
    result = _invoice_evidence(p, event, provider, invoice_id, cause, now, extra_facts=facts)
    if dispute.status == "lost" and p.cycle is not None:
        _reopen_after_lost_dispute(p, event, provider, invoice_id, cause, now, facts)
    return result


def _reopen_after_lost_dispute(p: Processing, event: ProviderEvent, provider: PaymentProvider, invoice_id: str,
                               cause: Cause, now: datetime, facts: tuple[FactSpec, ...]) -> None:
    cycle = DunningCycle.objects.select_related("invoice", "subscription", "pending_attempt").get(pk=p.cycle.pk)
    if cycle.state != CycleState.RECOVERED:
        return
    result = cycle_accept_transition(cycle_pk=cycle.pk, edge="reopen_after_dispute", expect=Expect.from_cycle(cycle),
                                     cause=cause, evidence=Evidence(facts=facts), now=now)
    p.detail.append(f"reopen_after_dispute: {'accepted' if result.accepted else result.reason}")
    if not result.accepted:
        return
    p.outcome = EventOutcome.APPLIED
    # The reopened debt goes to grace at once (what a paid receipt of a reopened cycle plans), not
    # after another read of the invoice: an old copy of it (open, never attempted) plans nothing and
    # left the cycle in PAYMENT_FAILED with no deadline.
    reopened = result.cycle
    grace = cycle_accept_transition(cycle_pk=cycle.pk, edge="start_grace", expect=Expect.from_cycle(reopened),
                                    cause=cause, evidence=Evidence(), now=now)
    p.detail.append(f"start_grace: {'accepted' if grace.accepted else grace.reason}")


def _refuse_stale_invoice_read(provider: PaymentProvider, invoice_id: str, *, must_be_paid: bool) -> None:
    """Payment and dispute events often arrive long after their invoice was settled: a read of
    the invoice that is an old copy (see `invoice_read_is_stale`) would move the mirror back when
    the event is processed, so the event is left pending and asked again, as `_invoice_evidence`
    does for a paid event read unpaid. A refunded or disputed charge paid its invoice."""
    stale = invoice_read_is_stale(provider.fetch_invoice(invoice_id), must_be_paid=must_be_paid)
    if stale:
        raise ProviderIndeterminate(stale)


def invoice_read_is_stale(inv: ProviderInvoice, *, must_be_paid: bool = False) -> str:
    """Why a fresh read of an invoice is an old copy (a lagging replica or cache), or "" when it
    is not. An invoice only moves forward (draft → open → uncollectible → paid / void), so a read
    that shows it behind a receipt we already hold cannot be the provider's current invoice."""
    if invoice_status_rank(inv.status) == FINAL_INVOICE_STATUS_RANK:
        # Nothing is ahead of paid or void, so no receipt can make such a read old: every paid
        # event's read ends here, without the query for the statuses held.
        return ""
    held = set(ProviderReceipt.objects.filter(object_type="invoice", object_id=inv.id)
               .values_list("status", flat=True).distinct())
    floor = max([invoice_status_rank(status, -1) for status in held]
                + [invoice_status_rank("paid") if must_be_paid else -1])
    if invoice_status_rank(inv.status) >= floor:
        return ""
    shown = ", ".join(sorted(held)) or "paid, for a refunded or disputed charge"
    return f"invoice {inv.id} reads {inv.status}, behind what the provider already showed ({shown}): a stale read; " \
           f"asking again later"


def invoice_refresh(*, provider_name: str, invoice_id: str, cause: Cause, now: datetime | None = None) -> Processing:
    """Fetch one invoice now and reconcile its cycle (opening it when new), as an event naming the
    invoice would: for invoices no provider event names, such as the renewal orders the merchant
    opens itself for Alipay. Raises ProviderIndeterminate when the provider cannot say."""
    now = now or trusted_now()
    return _invoice_evidence(Processing(), None, get_provider(provider_name), invoice_id, cause, now)


def event_process_fresh(event: ProviderEvent, *, now: datetime, provider: PaymentProvider | None = None
                        ) -> Processing:
    """The processing of `event_process`, run again on a fresh fetch of the provider's objects,
    WITHOUT recording the outcome on the event: `dunning.evidence.reprocessing` records it beside
    the audit row of the staff member who asked. Raises ProviderIndeterminate when the provider
    cannot be asked (nothing is decided then)."""
    return _process(event, provider or get_provider(event.provider), now)
