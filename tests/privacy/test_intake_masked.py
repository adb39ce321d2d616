"""At rest only the desensitised body is kept: over HTTP with a real Stripe-signed body carrying
PII, and through processing with the simulator as the provider (decisions unchanged)."""

from __future__ import annotations

import hashlib
import json

import pytest
from django.db import transaction

from dunning.clock import trusted_now
from dunning.evidence import intake
from dunning.evidence.processing import event_process, event_process_fresh
from dunning.models import (
    DunningCycle,
    EventOutcome,
    MonetaryFact,
    ProviderEvent,
    ProviderReceipt,
    TransitionReceipt,
    WebhookDelivery,
)
from dunning.privacy import keyed_hash
from tests.support.signing import event_body, stripe_signature

URL = "/webhooks/stripe/"
SECRET = "whsec_local"
EMAIL, NAME, PHONE, STREET, FINGERPRINT = "jane.doe@example.com", "Jane Doe", "+1 415 555 0100", "1 Main St", "Xt5EWL"
PII = (EMAIL, NAME, PHONE, STREET, FINGERPRINT)


def charge_with_pii() -> dict:
    return {"id": "ch_pii", "object": "charge", "amount": 4900, "currency": "usd", "status": "failed",
            "invoice": "in_pii", "customer": "cus_pii", "receipt_email": EMAIL,
            "billing_details": {"email": EMAIL, "name": NAME, "phone": PHONE,
                                "address": {"line1": STREET, "city": "Springfield", "country": "US"}},
            "payment_method_details": {"type": "card", "card": {"brand": "visa", "last4": "4242",
                                                                "fingerprint": FINGERPRINT, "exp_month": 4,
                                                                "exp_year": 2031}}}


@pytest.fixture(autouse=True)
def webhook_settings(settings):
    settings.STRIPE_WEBHOOK_SECRETS = [SECRET]
    settings.STRIPE_ACCOUNT = "acct_demo"


def post(client, body: bytes, signature: str):
    return client.post(URL, data=body, content_type="application/json", HTTP_STRIPE_SIGNATURE=signature)


def assert_no_pii(stored: bytes | str) -> None:
    text = stored.decode("utf-8", "replace") if isinstance(stored, bytes) else stored
    for value in PII:
        assert value not in text, f"{value!r} stored in the clear"


def test_a_signed_body_with_pii_is_verified_on_the_raw_bytes_and_stored_masked(db, client,
                                                                                django_capture_on_commit_callbacks):
    body = event_body("evt_pii", "charge.failed", obj=charge_with_pii())
    with django_capture_on_commit_callbacks() as handed_off:
        first = post(client, body, stripe_signature(body, SECRET))
        again = post(client, body, stripe_signature(body, SECRET))
    assert first.status_code == again.status_code == 200, first.content
    assert (first.json()["duplicate"], again.json()["duplicate"]) == (False, True), "the redelivery dedupes"
    assert len(handed_off) == 1
    deliveries = list(WebhookDelivery.objects.filter(claimed_event_id="evt_pii").order_by("pk"))
    assert [d.verification for d in deliveries] == ["VERIFIED", "VERIFIED"]
    raw_digest = hashlib.sha256(body).hexdigest()
    assert {d.body_sha256 for d in deliveries} == {raw_digest}, "the digest is of the raw bytes, the same each time"
    assert deliveries[0].body_size == len(body)
    stored = bytes(deliveries[0].body)
    assert bytes(deliveries[1].body) == stored, "the same bytes are stored the same way"
    assert_no_pii(stored)
    event = ProviderEvent.objects.get(event_id="evt_pii")
    assert_no_pii(json.dumps(event.payload))
    assert json.loads(stored) == event.payload
    obj = event.payload["data"]["object"]
    assert obj["receipt_email"] == obj["billing_details"]["email"] == keyed_hash(EMAIL, "email")
    assert obj["payment_method_details"]["card"]["last4"] == "**** 4242"
    assert (obj["id"], obj["amount"], obj["currency"], obj["status"], obj["invoice"]) == (
        "ch_pii", 4900, "usd", "failed", "in_pii")


@pytest.mark.parametrize("case", ["wrong secret", "cut at the size limit"])
def test_a_rejected_delivery_is_kept_masked(db, client, settings, case):
    body = event_body("evt_bad_pii", "charge.failed", obj=charge_with_pii())
    signature = stripe_signature(body, "whsec_not_ours")
    if case == "cut at the size limit":
        settings.WEBHOOK_MAX_BODY_BYTES = len(body) - 40  # the kept prefix is not JSON any more
        signature = stripe_signature(body, SECRET)
    response = post(client, body, signature)
    assert response.status_code == (400 if case == "wrong secret" else 413)
    delivery = WebhookDelivery.objects.get()
    assert delivery.verification == "REJECTED"
    read = body if case == "wrong secret" else body[:settings.WEBHOOK_MAX_BODY_BYTES + 1]  # the view reads no more
    assert delivery.body_sha256 == hashlib.sha256(read).hexdigest(), "the digest is of the raw bytes read"
    assert len(bytes(delivery.body)) > 0, "kept, not dropped"
    assert_no_pii(bytes(delivery.body))
    assert not ProviderEvent.objects.exists()


# --------------------------------------------------------------------------- processing decisions


def _decision(result) -> tuple:
    """Everything processing decided, without times."""
    return (
        result.outcome, tuple(result.detail),
        tuple(DunningCycle.objects.order_by("pk").values_list("state", "failure_class", "decline_code",
                                                               "subscription__entitlement_profile")),
        tuple(MonetaryFact.objects.order_by("pk").values_list("kind", "amount", "currency", "dedupe_key")),
        tuple(ProviderReceipt.objects.order_by("pk").values_list("object_type", "object_id", "status", "amount",
                                                                 "currency")),
        tuple(TransitionReceipt.objects.order_by("pk").values_list("edge", "from_state", "to_state", "accepted")),
    )


def _decided_with(event: ProviderEvent, payload: dict, now) -> tuple:
    """What processing `event` with `payload` decides, undone afterwards (a savepoint, not an atomic
    block: the acceptance service opens durable transactions, which refuse to nest in one)."""
    event.payload = payload  # in memory only: the stored row keeps its masked payload
    undo = transaction.savepoint()
    try:
        return _decision(event_process_fresh(event, now=now))
    finally:
        transaction.savepoint_rollback(undo)


def test_processing_a_masked_event_decides_what_the_raw_one_would(sim, monkeypatch):
    customer = sim.create_customer(EMAIL, card="ok", name=NAME)
    sub_id = sim.create_subscription(customer, "price_monthly_pro", amount=4900)
    sim.deliver_all()
    monkeypatch.setattr(intake, "_enqueue", lambda pk: None)  # leave the next events pending: compared first
    sim.set_card(customer, "insufficient_funds")
    invoice_id = sim.create_renewal_invoice(sub_id)
    sim.provider_attempt(invoice_id)
    sim.deliver_all()
    pending = list(ProviderEvent.objects.filter(outcome=EventOutcome.PENDING).order_by("received_at", "pk"))
    assert {e.event_type for e in pending} >= {"invoice.created", "invoice.payment_failed"}
    carried_pii = 0
    for event in pending:
        raw = json.loads(json.dumps(sim.store.events_by_id[event.event_id]))
        if EMAIL in json.dumps(raw):
            carried_pii += 1
            assert raw != event.payload and EMAIL not in json.dumps(event.payload), "stored masked"
        now = trusted_now()
        stored = ProviderEvent.objects.get(pk=event.pk)
        masked = _decided_with(stored, stored.payload, now)
        unmasked = _decided_with(ProviderEvent.objects.get(pk=event.pk), raw, now)
        assert masked == unmasked, event.event_type
        event_process(event_pk=event.pk, now=now)
    assert carried_pii >= 2, "the invoice events carried the customer's email"
    cycle = DunningCycle.objects.select_related("subscription").get(invoice__provider_invoice_id=invoice_id)
    assert cycle.state == "RETRY_SCHEDULED" and cycle.decline_code == "insufficient_funds"
    assert cycle.subscription.entitlement_profile == "READ_EXPORT_NO_NEW_JOBS"
    for delivery in WebhookDelivery.objects.all():
        assert EMAIL not in bytes(delivery.body).decode() and NAME not in bytes(delivery.body).decode()
    for stored in [*ProviderEvent.objects.values_list("payload", flat=True),
                   *ProviderReceipt.objects.values_list("body", flat=True)]:
        assert EMAIL not in json.dumps(stored) and NAME not in json.dumps(stored)
    assert ProviderReceipt.objects.filter(body__customer_email=keyed_hash(EMAIL, "email")).exists()
