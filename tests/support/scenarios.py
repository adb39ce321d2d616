"""Scenario steps against the simulator: subscribe, fail a renewal, pay, with the app's webhook
view receiving the deliveries."""

from __future__ import annotations

import itertools

from dunning.acceptance.inputs import Cause
from dunning.models import DunningCycle
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
