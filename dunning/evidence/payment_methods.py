"""A customer's new payment method answers a hard decline (SPEC §8, §9).

`customer.updated`, `payment_method.attached` and `setup_intent.succeeded` only say *which
customer* to look at. The customer is fetched fresh (its default payment method is the
evidence, stored as a receipt), and for each open cycle waiting on that customer the invoice
and its last payment are fetched too, to learn which payment method was declined. A default
that differs from the declined one clears `customer_action_required` through the acceptance
service (`clear_customer_action`, citing the customer receipt); the same one — still the
declined card, or a card already accepted once — changes nothing, whichever event brought it
and however often.

What clearing means depends on who retries:

- LOCAL authority: the cycle becomes eligible for a retry again (the failure class of the old
  card's hard decline no longer stands, see `DunningCycle.clear_customer_action`), and the
  `local_retries` job schedules it on the policy's intervals and dispatches it with a persisted
  key, within the same attempt budget. Nothing is charged here.
- PAYMENT_PROVIDER authority: nothing is charged locally. The provider's own retry of the
  invoice (a `next_payment_attempt`, then its outcome) is the evidence, as always; the
  customer may also pay at once ("Pay now", `dunning.actions.retry_now.cycle_pay_now`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from dunning.acceptance.guards import STALE_REFUSALS
from dunning.acceptance.inputs import Cause, Evidence, Expect, TransitionResult
from dunning.acceptance.transitions import cycle_accept_transition
from dunning.clock import trusted_now
from dunning.evidence.next_edge import cycle_reconcile_with_invoice
from dunning.evidence.processing_result import Processing
from dunning.evidence.receipts import receipt_record
from dunning.models import DunningCycle, EventOutcome, ProviderEvent, ProviderReceipt
from dunning.models.cycle import CUSTOMER_ACTIONABLE_STATES
from dunning.reads.cycles import cycle_read
from subscriptions.models import Customer, Subscription
from subscriptions.providers.base import PaymentProvider, ProviderCustomer, ProviderNotFound
from subscriptions.providers.registry import get_provider
from subscriptions.providers.stripe_shapes import PAYMENT_METHOD_EVENT_TYPES

__all__ = ["PAYMENT_METHOD_EVENT_TYPES", "customer_payment_method_refresh", "payment_method_event"]
UNPAID = ("open", "uncollectible")
CAS_TRIES = 3


@dataclass
class MethodRefresh:
    """What one fresh look at a customer's payment method did."""

    customer_known: bool = False
    payment_method: str | None = None
    subscriptions: list[Subscription] = field(default_factory=list)
    results: list[TransitionResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def cleared(self) -> list[TransitionResult]:
        return [r for r in self.results if r.accepted and r.edge == "clear_customer_action"]


def event_customer_id(event_type: str, obj: dict[str, Any]) -> str:
    """The customer an event names (a customer object, or a payment method / setup intent's customer)."""
    if event_type.startswith("customer."):
        return str(obj.get("id") or "")
    customer = obj.get("customer")
    return str((customer.get("id") if isinstance(customer, dict) else customer) or "")


def payment_method_event(p: Processing, event: ProviderEvent, provider: PaymentProvider, cause: Cause,
                         now: datetime) -> Processing:
    """The event-processing branch for PAYMENT_METHOD_EVENT_TYPES (called from `_process`)."""
    customer_id = event_customer_id(event.event_type, event.payload["data"]["object"])
    if not customer_id:
        return p.finish(EventOutcome.IGNORED, f"{event.event_type} names no customer")
    refresh = customer_payment_method_refresh(provider_customer_id=customer_id, cause=cause, now=now,
                                              provider=provider, event=event)
    p.detail.extend(refresh.notes)
    if not refresh.customer_known or not refresh.subscriptions:
        return p.finish(EventOutcome.IGNORED, f"customer {customer_id} has no subscription here")
    cleared = refresh.cleared
    p.subscription = cleared[0].cycle.subscription if cleared else refresh.subscriptions[0]
    if cleared:
        p.cycle = cleared[0].cycle
        p.invoice = p.cycle.invoice
    moved = [r for r in refresh.results if r.accepted and r.edge != "record_evidence"]
    return p.finish(EventOutcome.APPLIED if moved else EventOutcome.NO_CHANGE)


def customer_payment_method_refresh(*, provider_customer_id: str, cause: Cause, now: datetime | None = None,
                                    provider: PaymentProvider | None = None,
                                    event: ProviderEvent | None = None) -> MethodRefresh:
    """Fetch the customer and clear `customer_action_required` on each of its open cycles whose
    declined payment method is no longer the default. Safe to call any number of times."""
    provider = provider or get_provider()
    now = now or trusted_now()
    out = MethodRefresh()
    customer = Customer.objects.filter(provider=provider.name, provider_customer_id=provider_customer_id).first()
    if customer is None:
        return out
    out.customer_known = True
    out.subscriptions = list(customer.subscriptions.order_by("pk"))
    waiting = list(DunningCycle.objects.filter(subscription__customer=customer, customer_action_required=True,
                                               state__in=CUSTOMER_ACTIONABLE_STATES)
                   .order_by("opened_at", "pk").values_list("pk", flat=True))
    if not waiting:
        out.notes.append("no open invoice waits for a new payment method")
        return out
    try:
        remote = provider.fetch_customer(provider_customer_id)
    except ProviderNotFound:
        out.notes.append(f"provider has no customer {provider_customer_id}")
        return out
    receipt = receipt_record(object_type="customer", body=remote.raw or {"id": remote.id}, account=remote.account,
                             fetched_at=trusted_now(), cause_event=event, provider=provider.name)
    out.payment_method = remote.default_payment_method
    for cycle_pk in waiting:
        _answer_one(out, cycle_pk, remote, receipt, provider, cause, now, event)
    return out


def _answer_one(out: MethodRefresh, cycle_pk: int, remote: ProviderCustomer, customer_receipt: ProviderReceipt,
                provider: PaymentProvider, cause: Cause, now: datetime, event: ProviderEvent | None) -> None:
    cycle = cycle_read(cycle_pk)
    invoice_id = cycle.invoice.provider_invoice_id
    try:
        inv = provider.fetch_invoice(invoice_id)
    except ProviderNotFound:
        out.notes.append(f"provider has no invoice {invoice_id}")
        return
    invoice_receipt = receipt_record(object_type="invoice", body=inv.raw, invoice=cycle.invoice, account=inv.account,
                                     fetched_at=trusted_now(), cause_event=event, provider=provider.name)
    if inv.status not in UNPAID:
        # Settled meanwhile (paid or void): that receipt moves the cycle, not the card.
        out.results.extend(cycle_reconcile_with_invoice(cycle_pk=cycle_pk, inv=inv, receipt=invoice_receipt,
                                                        decline_code="", cause=cause, now=now))
        out.notes.append(f"invoice {invoice_id} is {inv.status}")
        return
    declined = _declined_payment_method(provider, inv.payment_refs, event)
    method = remote.default_payment_method
    if not method:
        out.notes.append(f"invoice {invoice_id}: the customer has no default payment method yet")
        return
    if declined is None:
        out.notes.append(f"invoice {invoice_id}: the provider does not say which payment method was declined")
        return
    if declined == method:
        out.notes.append(f"invoice {invoice_id}: {method} is still the declined payment method")
        return
    for _ in range(CAS_TRIES):
        if not cycle.customer_action_required or cycle.state not in CUSTOMER_ACTIONABLE_STATES:
            return  # another event about the same card got there first
        result = cycle_accept_transition(
            cycle_pk=cycle_pk, edge="clear_customer_action", expect=Expect.from_cycle(cycle), cause=cause,
            evidence=Evidence(receipt=customer_receipt),
            params={"payment_method": method, "declined_payment_method": declined}, now=now)
        out.results.append(result)
        if result.accepted or result.reason not in STALE_REFUSALS:
            out.notes.append(f"invoice {invoice_id}: clear_customer_action "
                             f"{'accepted' if result.accepted else 'refused: ' + result.reason}")
            return
        cycle = cycle_read(cycle_pk)


def _declined_payment_method(provider: PaymentProvider, payment_refs: tuple[str, ...],
                             event: ProviderEvent | None) -> str | None:
    """The payment method of the invoice's latest payment: the one the last attempt was declined on."""
    if not payment_refs:
        return None
    payment = provider.fetch_payment(payment_refs[-1])
    receipt_record(object_type=payment.object or "payment_intent", body=payment.raw or {"id": payment.id},
                   fetched_at=trusted_now(), cause_event=event, provider=provider.name)
    return provider.payment_method_of(payment)
