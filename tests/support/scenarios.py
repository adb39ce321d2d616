"""Scenario steps against the simulator: subscribe, fail a renewal, pay, with the app's webhook
view receiving the deliveries."""

from __future__ import annotations

import itertools

from dunning.acceptance.inputs import Cause
from dunning.models import DunningCycle, EventOutcome, ProviderEvent
from tests.support.builders import reload

_emails = itertools.count(1)


def subscribe(sim, *, price: str = "price_monthly_pro", card: str = "ok", amount: int = 4900) -> tuple[str, str]:
    customer = sim.create_customer(f"payer{next(_emails)}@example.com", card=card)
    sub_id = sim.create_subscription(customer, price, amount=amount)
    return customer, sub_id


def failed_renewal(sim, *, price: str = "price_monthly_pro", decline: str = "stolen_card", deliver: bool = True
                   ) -> tuple[str, str, DunningCycle | None]:
    """A renewal whose first charge failed; with a hard decline there is no retry, so the cycle
    sits in GRACE_ACTIVE with customer action required."""
    customer, sub_id = subscribe(sim, price=price)
    sim.deliver_all()
    sim.set_card(customer, decline)
    invoice_id = sim.create_renewal_invoice(sub_id)
    sim.provider_attempt(invoice_id)
    if not deliver:
        return customer, invoice_id, None
    sim.deliver_all()
    return customer, invoice_id, cycle_of(invoice_id)


def hide(sim, object_id: str) -> dict:
    """The provider's reads stop knowing the object (a lagging read replica); returns it."""
    with sim.lock:
        return sim.store.objects.pop(object_id)


def bring_back(sim, obj: dict) -> None:
    with sim.lock:
        sim.store.objects[obj["id"]] = obj


def failed_renewal_quarantined(sim, *, email: str = "late@example.com") -> tuple[str, dict, ProviderEvent]:
    """A renewal fails while the provider's reads do not know the invoice: its events are held.
    The invoice stays hidden; `bring_back(sim, invoice)` ends the lag."""
    customer = sim.create_customer(email, card="ok")
    sub_id = sim.create_subscription(customer, "price_monthly_pro", amount=4900)
    sim.deliver_all()
    sim.set_card(customer, "insufficient_funds")
    invoice_id = sim.create_renewal_invoice(sub_id)
    sim.provider_attempt(invoice_id)
    invoice = hide(sim, invoice_id)
    sim.deliver_all()
    event = ProviderEvent.objects.get(event_type="invoice.payment_failed", payload__data__object__id=invoice_id)
    assert event.outcome == EventOutcome.QUARANTINED
    assert event.outcome_detail == f"provider has no invoice {invoice_id}"
    assert not DunningCycle.objects.filter(invoice__provider_invoice_id=invoice_id).exists()
    return sub_id, invoice, event


def cycle_of(invoice_id: str) -> DunningCycle:
    return reload(DunningCycle.objects.get(invoice__provider_invoice_id=invoice_id))


def pay_without_webhook(sim, customer: str, invoice_id: str) -> None:
    """The customer pays at the provider; the webhook has not reached us (yet)."""
    sim.set_card(customer, "ok")
    sim.customer_pays(invoice_id)
    lose_pending_webhooks(sim)


def lose_pending_webhooks(sim) -> None:
    with sim.lock:
        sim.outbox.clear()


JOB = Cause.job("test")
