"""A decision's fetch that stays rate-limited is never dropped silently (issue 21 item 1): the event
stays PENDING with the reason in its ``error``, the inbox sweep's run notes it, and once Stripe
answers again the event is applied."""

from __future__ import annotations

from datetime import timedelta

from dunning.jobs.framework import job_run
from dunning.models import DunningCycle, EventOutcome, ProviderEvent


def test_an_event_whose_invoice_fetch_stays_rate_limited_stays_pending_with_the_reason(sim, settings, time_machine):
    settings.STRIPE_RATE_LIMIT_RETRY_SECONDS = 0.6
    customer = sim.create_customer("payer@example.com", card="ok")
    sub_id = sim.create_subscription(customer, "price_monthly_pro", amount=4900)
    sim.deliver_all()
    sim.set_card(customer, "insufficient_funds")
    invoice_id = sim.create_renewal_invoice(sub_id)
    sim.provider_attempt(invoice_id)

    fault = sim.faults.rate_limit("GET /v1/invoices/*", count=10_000)
    sim.deliver_all()
    event = ProviderEvent.objects.get(event_type="invoice.payment_failed")
    assert event.outcome == EventOutcome.PENDING and event.processed_at is None
    assert event.error.startswith("provider did not answer: Stripe rate-limited the request (HTTP 429 rate_limit")
    assert "tries in" in event.error and "0.6 s rate-limit budget" in event.error
    assert fault.fired >= 2
    assert not DunningCycle.objects.filter(invoice__provider_invoice_id=invoice_id).exists()

    # The inbox sweep asks again a minute later; still limited, its run says why.
    time_machine.move_to(event.received_at + timedelta(seconds=61), tick=True)
    run = job_run("inbox_sweep")
    assert run.errors >= 1
    assert f"event {event.pk}: provider did not answer: Stripe rate-limited the request" in run.detail
    event.refresh_from_db()
    assert event.outcome == EventOutcome.PENDING and event.attempts >= 2 and "rate-limited" in event.error

    # Stripe answers again: the next sweep processes every event held back (the failure itself is
    # applied by whichever of the renewal's events comes first; the others then change nothing).
    sim.faults.clear()
    time_machine.move_to(event.received_at + timedelta(seconds=180), tick=True)
    job_run("inbox_sweep")
    event.refresh_from_db()
    assert event.processed_at is not None and event.error == "", (event.outcome, event.error)
    assert event.outcome in (EventOutcome.APPLIED, EventOutcome.NO_CHANGE)
    assert not ProviderEvent.objects.filter(processed_at__isnull=True).exists()
    cycle = DunningCycle.objects.get(invoice__provider_invoice_id=invoice_id)
    assert cycle.state == "RETRY_SCHEDULED"
