"""Concurrent deliveries over separate connections: one fact, one transition, one message."""

from __future__ import annotations

import functools

import pytest
from django.test import Client

from dunning.models import FactKind, MonetaryFact, OutboxMessage, ProviderEvent, TransitionReceipt
from tests.support.threads import run_together
from tests.verification.fake_stripe import StripeSimulator

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def provider_sim(settings):
    from pathlib import Path

    from dunning.policy.publishing import policy_publish

    for path in sorted(Path("dunning/policy/shipped").glob("*.yaml")):
        policy_publish(text=path.read_text())
    simulator = StripeSimulator(account="acct_demo", webhook_secrets=["whsec_local"], auto_deliver=False)
    settings.STRIPE_API_BASE = simulator.start()
    settings.STRIPE_WEBHOOK_SECRETS = ["whsec_local"]
    settings.STRIPE_ACCOUNT = "acct_demo"
    settings.STRIPE_TIMEOUT_SECONDS = 5
    settings.STRIPE_API_VERSION = ""
    yield simulator
    simulator.stop()


def _post_concurrently(payloads):
    def run(body, headers):
        response = Client().post("/webhooks/stripe/", data=body, content_type="application/json",
                                 HTTP_STRIPE_SIGNATURE=headers["Stripe-Signature"])
        return response.status_code

    return run_together([functools.partial(run, *p) for p in payloads], timeout=60)


@pytest.mark.parametrize("same_event", [True, False], ids=["one-event-six-times", "six-events-one-invoice"])
def test_parallel_deliveries_record_one_fact_one_transition_one_message(provider_sim, same_event):
    sim = provider_sim
    customer = sim.create_customer("race@example.com", card="ok")
    sub_id = sim.create_subscription(customer, "price_monthly_pro", amount=4900)
    sim.set_card(customer, "insufficient_funds")
    invoice_id = sim.create_renewal_invoice(sub_id)
    sim.provider_attempt(invoice_id)
    events = [e for e in sim.pending_events() if e["data"]["object"].get("id") == invoice_id
              or e["type"].startswith(("payment_intent.", "charge."))]
    if same_event:
        failed = next(e for e in events if e["type"] == "invoice.payment_failed")
        payloads = [sim.signed_payload(failed)] * 6
    else:
        payloads = [sim.signed_payload(e) for e in events[:6]]
    statuses = _post_concurrently(payloads)
    assert statuses == [200] * len(payloads)

    failed_facts = MonetaryFact.objects.filter(kind=FactKind.PAYMENT_FAILED, invoice__provider_invoice_id=invoice_id)
    assert failed_facts.count() == 1
    accepted = TransitionReceipt.objects.filter(accepted=True, cycle__invoice__provider_invoice_id=invoice_id)
    assert accepted.filter(edge="record_failure").count() == 1
    assert accepted.filter(edge="start_grace").count() == 1
    assert OutboxMessage.objects.filter(topic="notification.requested", payload__template="payment_failed").count() == 1
    pending = ProviderEvent.objects.filter(outcome="PENDING")
    assert not pending.exists(), list(pending.values_list("event_type", "attempts", "error"))
    assert len(sim.successful_charges(invoice_id)) == 0
