"""An unknown payment past the provider's key retention has an owner's way out (issue 15, item 3):
the owner or a billing lead resolves it on a fresh receipt of the invoice and its payments; the
decision must agree with the receipt; the same attempt is resolved, never replaced; until then
grace cannot expire."""

from __future__ import annotations

from datetime import timedelta

import pytest

from dunning.actions.local_retry import KEY_RESEND_WINDOW
from dunning.actions.support import cycle_resolve_unknown
from dunning.jobs.framework import job_run
from dunning.models import PaymentAttempt
from tests.support.actors import AGENTS, LEADS, make_staff
from tests.support.scenarios import cycle_of, failed_renewal


@pytest.fixture
def people(db):
    return make_staff("lead", LEADS), make_staff("agent2", AGENTS)


@pytest.fixture
def unknown_past_retention(sim, time_machine, people):
    """A local retry whose pay call timed out before the provider charged (so the invoice is still
    open), left unknown beyond the provider's 24 h key retention."""
    time_machine.move_to("2026-12-01T09:00:00Z", tick=True)
    customer, invoice_id, _ = failed_renewal(sim, price="price_monthly_local", decline="insufficient_funds")
    job_run("local_retries")
    time_machine.move_to(cycle_of(invoice_id).next_attempt_at + timedelta(seconds=1), tick=True)
    sim.faults.error_500("POST /v1/invoices/*/pay", apply=False, count=50)
    sim.faults.error_500("GET /v1/invoices/*", count=50)
    job_run("local_retries")
    cycle = cycle_of(invoice_id)
    assert cycle.state == "PAYMENT_UNKNOWN"
    later = max(cycle.pending_attempt.dispatched_at + KEY_RESEND_WINDOW, cycle.grace_expires_at) + timedelta(hours=2)
    time_machine.move_to(later, tick=True)
    sim.faults.clear()
    job_run("unknown_payments")
    cycle = cycle_of(invoice_id)
    assert cycle.state == "PAYMENT_UNKNOWN", "past the key's retention the job may not resend; a person decides"
    assert cycle.grace_expires_at < later, "the grace deadline has passed too"
    return customer, invoice_id, cycle


def test_grace_cannot_expire_while_the_payment_is_unknown(unknown_past_retention):
    _, invoice_id, _ = unknown_past_retention
    job_run("grace_expiry")
    assert cycle_of(invoice_id).state == "PAYMENT_UNKNOWN"


def test_only_the_owner_or_a_lead_resolves_and_the_decision_must_agree_with_the_receipt(
        unknown_past_retention, people, sim):
    _, invoice_id, cycle = unknown_past_retention
    lead, agent = people
    (attempt,) = PaymentAttempt.objects.filter(cycle=cycle, origin="LOCAL")
    assert cycle.unknown_owner != agent
    denied = cycle_resolve_unknown(cycle_pk=cycle.pk, user=agent, decision="FAILED", reason="r", ticket="T-1")
    assert denied.result.reason == "NOT_THE_OWNER"
    paid_claim = cycle_resolve_unknown(cycle_pk=cycle.pk, user=lead, decision="PAID", reason="bank says paid",
                                       ticket="T-2")
    assert not paid_claim.result.accepted and paid_claim.result.reason == "INVOICE_NOT_PAID"
    assert paid_claim.fresh_receipt is not None and paid_claim.fresh_receipt.status == "open"
    failed = cycle_resolve_unknown(cycle_pk=cycle.pk, user=lead, decision="FAILED", reason="no charge at the bank",
                                   ticket="T-3")
    assert failed.result.accepted, failed.result
    cycle = cycle_of(invoice_id)
    assert cycle.state == "GRACE_ACTIVE" and cycle.pending_attempt is None
    attempt.refresh_from_db()
    assert attempt.state == "FAILED", "the same attempt is resolved"
    assert PaymentAttempt.objects.filter(cycle=cycle, origin="LOCAL").count() == 1, "never replaced"
    assert sim.successful_charges(invoice_id) == []
    job_run("grace_expiry")
    assert cycle_of(invoice_id).state == "RESTRICTED", "the grace deadline applies again once resolved"


def test_a_failure_claim_is_refused_when_the_provider_shows_the_payment(unknown_past_retention, people, sim):
    customer, invoice_id, cycle = unknown_past_retention
    lead, _ = people
    sim.set_card(customer, "ok")
    sim.customer_pays(invoice_id)  # the money arrived at the provider after all
    sim.outbox.clear()
    refused = cycle_resolve_unknown(cycle_pk=cycle.pk, user=lead, decision="FAILED", reason="r", ticket="T-4")
    assert not refused.result.accepted and refused.result.reason in ("DECISION_CONTRADICTS_RECEIPT",)
    paid = cycle_resolve_unknown(cycle_pk=cycle.pk, user=lead, decision="PAID", reason="provider shows it",
                                 ticket="T-5")
    assert paid.result.accepted and cycle_of(invoice_id).state == "RECOVERED"
    assert cycle_of(invoice_id).subscription.entitlement_profile == "FULL"


def test_the_console_offers_the_way_out_on_the_subscription_page(unknown_past_retention, people, client):
    from django.urls import reverse

    _, invoice_id, cycle = unknown_past_retention
    lead, _ = people
    client.force_login(lead)
    page = client.get(reverse("admin:subscriptions_subscription_change", args=[cycle.subscription_id]))
    assert "Resolve unknown payment" in page.content.decode()
    url = reverse("admin:subscriptions_subscription_console_cycle",
                  args=[cycle.subscription_id, "resolve_unknown_payment", cycle.pk])
    response = client.post(url, {"decision": "FAILED", "reason": "bank shows no charge", "ticket": "SUP-77"},
                           follow=True)
    assert "Resolved the unknown payment" in response.content.decode()
    assert cycle_of(invoice_id).state == "GRACE_ACTIVE"


def test_the_unknown_payment_alert_stays_open_until_the_attempt_is_resolved(unknown_past_retention, people):
    from dunning.models import Alert

    _, invoice_id, cycle = unknown_past_retention
    lead, _ = people
    job_run("alerts")
    (alert,) = Alert.objects.filter(kind="UNKNOWN_PAST_RETENTION")
    assert alert.resolved_at is None and alert.invoice.provider_invoice_id == invoice_id
    assert "Resolve unknown payment" in alert.detail
    job_run("unknown_payments")
    job_run("alerts")
    alert.refresh_from_db()
    assert alert.resolved_at is None and alert.occurrences >= 2, "still unknown: the alert stays open"
    resolved = cycle_resolve_unknown(cycle_pk=cycle.pk, user=lead, decision="FAILED", reason="no charge at the bank",
                                     ticket="T-6")
    assert resolved.result.accepted
    job_run("alerts")
    alert.refresh_from_db()
    assert alert.resolved_at is not None and alert.resolved_by == "job:alerts"
    assert Alert.objects.filter(kind="UNKNOWN_PAST_RETENTION", resolved_at__isnull=True).count() == 0
