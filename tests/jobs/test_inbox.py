"""Inbox sweep: an event whose Celery task never ran is processed by the sweep (SPEC §8, §10)."""

from __future__ import annotations

from datetime import timedelta

from dunning.jobs.framework import job_run
from dunning.models import EventOutcome, ProviderEvent
from tests.support.scenarios import cycle_of, failed_renewal


def test_event_left_pending_by_a_lost_task_is_processed_by_the_sweep(sim, client, time_machine):
    time_machine.move_to("2026-12-01T09:00:00Z", tick=True)
    customer, invoice_id, cycle = failed_renewal(sim)
    sim.set_card(customer, "ok")
    sim.customer_pays(invoice_id)
    (paid,) = [e for e in sim.pending_events() if e["type"] == "invoice.paid"]
    body, headers = sim.signed_payload(paid["id"])
    # Stored and acknowledged, but the after-commit hand-off to Celery never runs (broker down).
    response = client.post("/webhooks/stripe/", data=body, content_type="application/json",
                           HTTP_STRIPE_SIGNATURE=headers["Stripe-Signature"])
    assert response.status_code == 200
    event = ProviderEvent.objects.get(event_id=paid["id"])
    assert event.outcome == EventOutcome.PENDING

    assert job_run("inbox_sweep").examined == 0, "a fresh event is left to its task for a minute"
    time_machine.move_to(event.received_at + timedelta(seconds=61), tick=True)
    run = job_run("inbox_sweep")
    event.refresh_from_db()
    assert (run.examined, run.changed) == (1, 1) and event.outcome == EventOutcome.APPLIED
    assert cycle_of(invoice_id).state == "RECOVERED"
    assert job_run("inbox_sweep").examined == 0, "processed events are not swept again"


def test_sweep_counts_a_provider_that_does_not_answer_and_keeps_the_event(sim, client, time_machine):
    time_machine.move_to("2026-12-01T09:00:00Z", tick=True)
    customer, invoice_id, _ = failed_renewal(sim)
    sim.set_card(customer, "ok")
    sim.customer_pays(invoice_id)
    (paid,) = [e for e in sim.pending_events() if e["type"] == "invoice.paid"]
    body, headers = sim.signed_payload(paid["id"])
    client.post("/webhooks/stripe/", data=body, content_type="application/json",
                HTTP_STRIPE_SIGNATURE=headers["Stripe-Signature"])
    time_machine.move_to("2026-12-01T09:05:00Z", tick=True)
    sim.faults.error_500("GET /v1/invoices/*", count=20)
    run = job_run("inbox_sweep")
    assert run.errors == 1 and run.status == "PARTIAL"
    assert ProviderEvent.objects.get(event_id=paid["id"]).outcome == EventOutcome.PENDING
    sim.faults.clear()
    job_run("inbox_sweep")
    assert cycle_of(invoice_id).state == "RECOVERED"


def test_a_stale_read_of_a_paid_invoice_is_asked_again_not_taken_as_unpaid(sim, time_machine):
    """invoice.paid arrives while the provider's read still shows the invoice open: the event is
    kept pending and retried, so the recovery happens within a minute, not at grace expiry."""
    time_machine.move_to("2026-12-01T09:00:00Z", tick=True)
    customer, invoice_id, _ = failed_renewal(sim)
    sim.set_card(customer, "ok")
    sim.customer_pays(invoice_id)
    sim.faults.stale_read(invoice_id, count=20)  # every read during the deliveries lags
    sim.deliver_all()
    sim.faults.clear()
    (paid,) = [e for e in ProviderEvent.objects.filter(event_type="invoice.paid")
               if e.payload["data"]["object"]["id"] == invoice_id]
    assert paid.outcome == EventOutcome.PENDING and "stale read" in paid.error
    assert cycle_of(invoice_id).state != "RECOVERED"
    time_machine.move_to(paid.received_at + timedelta(seconds=61), tick=True)
    job_run("inbox_sweep")
    assert cycle_of(invoice_id).state == "RECOVERED"
    assert cycle_of(invoice_id).subscription.entitlement_profile == "FULL"
