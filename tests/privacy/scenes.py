"""Stored provider rows of every kind the retention job must tell apart, built directly (the job
only reads their columns), with desensitised bodies as the intake stores them."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime

from dunning.evidence.receipts import receipt_record
from dunning.models import DunningCycle, EventOutcome, FactKind, MonetaryFact, ProviderEvent, WebhookDelivery
from dunning.privacy import desensitise, desensitise_body

EMAIL = "jane.doe@example.com"


def stored_event(event_id: str, outcome: str, received_at: datetime, *, invoice_id: str = "in_kept") -> ProviderEvent:
    body = {"id": event_id, "object": "event", "type": "invoice.paid", "created": int(received_at.timestamp()),
            "data": {"object": {"id": invoice_id, "object": "invoice", "status": "paid", "amount_paid": 4900,
                                "customer_email": EMAIL, "customer_name": "Jane Doe"}}}
    raw = json.dumps(body).encode()
    processed = None if outcome in (EventOutcome.PENDING, EventOutcome.FAILED) else received_at
    event = ProviderEvent.objects.create(
        event_id=event_id, event_type="invoice.paid", payload=desensitise(body), signature_verified=True,
        received_at=received_at, processed_at=processed, outcome=outcome, attempts=1)
    WebhookDelivery.objects.create(
        received_at=received_at, body=desensitise_body(raw), body_size=len(raw),
        body_sha256=hashlib.sha256(raw).hexdigest(), verification="VERIFIED", claimed_event_id=event_id,
        event=event, http_status=200)
    return event


def rejected_delivery(received_at: datetime, *, verdict: str = "REJECTED") -> WebhookDelivery:
    raw = b'{"id": "evt_forged", "data": {"object": {"customer_email": "jane.doe@example.com"}}}'
    return WebhookDelivery.objects.create(
        received_at=received_at, body=desensitise_body(raw), body_size=len(raw),
        body_sha256=hashlib.sha256(raw).hexdigest(), verification=verdict, rejection_reason="NO_SIGNATURE")


def invoice_receipt_with_fact(cycle: DunningCycle, fetched_at: datetime, *, cause_event: ProviderEvent | None = None):
    invoice = cycle.invoice
    body = {"id": invoice.provider_invoice_id, "object": "invoice", "status": "paid", "amount_due": invoice.amount_due,
            "currency": invoice.currency, "customer_email": EMAIL}
    receipt = receipt_record(object_type="invoice", body=body, invoice=invoice, fetched_at=fetched_at,
                             cause_event=cause_event)
    fact = MonetaryFact.objects.create(
        kind=FactKind.PAYMENT_SUCCEEDED, invoice=invoice, cycle=cycle, amount=invoice.amount_due,
        currency=invoice.currency, receipt=receipt, dedupe_key=f"paid:{invoice.provider_invoice_id}:{receipt.pk}",
        occurred_at=fetched_at, recorded_at=fetched_at)
    return receipt, fact
