"""Access follows the contract, and grace ends on time (SPEC §5, §7; seed 002's five lines):
the grace deadline is independent of the provider's retry schedule, the provider subscription is
mirrored from fresh fetches with a fence, an ended contract revokes access, a dunning
cancellation reaches the provider, and each invoice's own price picks its cycle's policy."""

from __future__ import annotations

from datetime import timedelta

import pytest

from dunning.acceptance.inputs import Cause, ContractUpdate
from dunning.acceptance.subscription import subscription_accept_change
from dunning.jobs.framework import job_run
from dunning.models import Alert, EventOutcome, OutboxMessage, ProviderEvent
from dunning.models import TransitionReceipt as Receipt
from subscriptions.models import Subscription
from tests.support.scenarios import cycle_of, subscribe
from tests.support.signing import event_body, stripe_signature


def sub_of(sub_id: str) -> Subscription:
    return Subscription.objects.get(provider_subscription_id=sub_id)


@pytest.fixture
def clock(time_machine):
    time_machine.move_to("2026-12-01T09:00:00Z", tick=True)
    return time_machine


def retryable_failure(sim, *, price: str = "price_monthly_pro"):
    customer, sub_id = subscribe(sim, price=price)
    sim.deliver_all()
    sim.set_card(customer, "insufficient_funds")
    invoice_id = sim.create_renewal_invoice(sub_id)
    sim.provider_attempt(invoice_id)
    sim.deliver_all()
    return customer, sub_id, invoice_id


# --- 1. grace is a deadline, not a retry outcome -----------------------------------------------------


def test_a_provider_retry_scheduled_after_the_grace_end_does_not_extend_grace(sim, clock):
    """Smart-Retries-like: the provider's next try lies beyond a P7D grace. Grace still ends on
    time; the scheduled retry stays recorded, and its later success still recovers the cycle."""
    customer, sub_id, invoice_id = retryable_failure(sim)
    cycle = cycle_of(invoice_id)
    assert cycle.state == "RETRY_SCHEDULED"
    sim.reschedule(invoice_id, cycle.grace_expires_at + timedelta(days=5))
    sim.deliver_all()
    cycle = cycle_of(invoice_id)
    retry_at = cycle.next_attempt_at
    assert retry_at > cycle.grace_expires_at
    clock.move_to(cycle.grace_expires_at + timedelta(seconds=30), tick=True)
    run = job_run("grace_expiry")
    cycle = cycle_of(invoice_id)
    assert cycle.state == "RESTRICTED", run.detail
    assert cycle.subscription.entitlement_profile == "SUSPENDED"
    assert cycle.next_attempt_at == retry_at, "the scheduled retry stays recorded"
    expired = Receipt.objects.get(cycle=cycle, edge="expire_grace", accepted=True)
    assert expired.from_state == "RETRY_SCHEDULED"
    # The provider's retry later succeeds: the paid receipt recovers the cycle from RESTRICTED.
    clock.move_to(retry_at + timedelta(seconds=1), tick=True)
    sim.set_card(customer, "ok")
    sim.provider_attempt(invoice_id)
    sim.deliver_all()
    cycle = cycle_of(invoice_id)
    assert cycle.state == "RECOVERED" and cycle.subscription.entitlement_profile == "FULL"


def test_an_attempt_in_flight_holds_the_deadline_and_a_scheduled_one_does_not(db):
    from tests.support.builders import local_policy, make_policy, make_subscription, open_cycle, reload
    from tests.support.paths import Walker

    make_policy()
    scheduled = Walker(open_cycle(make_subscription())).to_retry_scheduled()
    scheduled.now = scheduled.cycle.grace_expires_at + timedelta(seconds=1)
    assert scheduled.step("expire_grace").from_state == "RETRY_SCHEDULED"
    local_policy()
    in_flight = Walker(open_cycle(make_subscription(price="price_local"))).to_dispatching()
    in_flight.now = in_flight.cycle.grace_expires_at + timedelta(days=1)
    from tests.support.builders import accept

    held = accept(in_flight.cycle, "expire_grace", now=in_flight.now)
    assert not held.accepted and reload(in_flight.cycle).state == "RETRY_DISPATCHING"


def test_the_customer_page_names_the_grace_deadline_while_a_retry_is_scheduled(sim, clock):
    from subscriptions.billing.wording import access_text

    _, _, invoice_id = retryable_failure(sim)
    cycle = cycle_of(invoice_id)
    assert cycle.state == "RETRY_SCHEDULED"
    text = access_text(cycle.subscription, [cycle], clock_now())
    deadline = cycle.grace_expires_at
    assert f"until {deadline.day} {deadline:%B}" in text.headline, text


# --- 2. the contract line ---------------------------------------------------------------------------


def test_a_customer_who_cancels_at_the_provider_loses_access_and_no_new_cycle_opens(sim, clock, client,
                                                                                 django_capture_on_commit_callbacks):
    _, sub_id = subscribe(sim)
    sim.deliver_all()
    assert sub_of(sub_id).entitlement_profile == "FULL"
    sim.cancel_subscription(sub_id)
    sim.deliver_all()
    sub = sub_of(sub_id)
    assert (sub.provider_status, sub.contract_phase, sub.entitlement_profile) == ("canceled", "canceled", "REVOKED")
    receipt = Receipt.objects.filter(subscription=sub, edge="contract_update", accepted=True).latest("pk")
    assert receipt.evidence_receipt.object_type == "subscription" and receipt.evidence_receipt.status == "canceled"
    # An invoice that still arrives for the ended contract opens no dunning cycle.
    late_invoice = sim.create_renewal_invoice(sub_id, finalize=False)
    body = event_body("evt_late_invoice", "invoice.created", {"id": late_invoice, "object": "invoice"})
    with django_capture_on_commit_callbacks(execute=True):
        client.post("/webhooks/stripe/", data=body, content_type="application/json",
                    HTTP_STRIPE_SIGNATURE=stripe_signature(body, "whsec_local"))
    held = ProviderEvent.objects.get(event_id="evt_late_invoice")
    assert held.outcome == EventOutcome.QUARANTINED and "CONTRACT_ENDED" in held.outcome_detail
    assert not sub.cycles.filter(invoice__provider_invoice_id=late_invoice).exists()


def test_cancel_at_period_end_keeps_access_until_the_period_ends_then_revokes_even_without_news(sim, clock):
    _, sub_id = subscribe(sim)
    sim.deliver_all()
    sim.cancel_subscription(sub_id, at_period_end=True)
    sim.deliver_all()
    sub = sub_of(sub_id)
    assert sub.cancel_at_period_end and sub.entitlement_profile == "FULL"
    generation = sub.entitlement_generation
    clock.move_to(sub.current_period_end + timedelta(seconds=10), tick=True)
    sim.faults.error_500("GET /v1/subscriptions/*", count=5)  # the provider cannot be asked
    run = job_run("contract_deadlines")
    sub = sub_of(sub_id)
    assert (sub.contract_phase, sub.entitlement_profile) == ("canceled", "REVOKED"), run.detail
    assert sub.entitlement_generation == generation + 1 and run.errors == 1
    assert job_run("contract_deadlines").examined == 0, "an ended contract is not examined again"


def test_pause_and_resume_follow_the_policy_and_a_reactivation_recomputes(sim, clock):
    _, sub_id = subscribe(sim)
    sim.deliver_all()
    sim.pause_subscription(sub_id)
    sim.deliver_all()
    sub = sub_of(sub_id)
    assert (sub.contract_phase, sub.entitlement_profile) == ("paused", "READ_EXPORT_NO_NEW_JOBS")
    sim.resume_subscription(sub_id)
    sim.deliver_all()
    sub = sub_of(sub_id)
    assert (sub.contract_phase, sub.entitlement_profile) == ("active", "FULL")


def test_an_older_read_never_rolls_a_newer_contract_back(sim, clock):
    from django.utils import timezone

    _, sub_id = subscribe(sim)
    sim.deliver_all()
    sub = sub_of(sub_id)
    newer = ContractUpdate(status="canceled", price_ids=("price_monthly_pro",), interval="month",
                           fetched_at=timezone.now(), ended_at=timezone.now())
    older = ContractUpdate(status="active", price_ids=("price_monthly_pro",), interval="month",
                           fetched_at=timezone.now() - timedelta(seconds=5))
    cause = Cause.system("test")
    assert subscription_accept_change(subscription_pk=sub.pk, change="contract_update", cause=cause, contract=newer,
                                      expect_contract_revision=sub.contract_revision)
    sub.refresh_from_db()
    stale = subscription_accept_change(subscription_pk=sub.pk, change="contract_update", cause=cause, contract=older,
                                       expect_contract_revision=sub.contract_revision)
    assert not stale.accepted and stale.reason == "STALE_CONTRACT_READ"
    assert Receipt.objects.get(pk=stale.receipt_id).rejection_reason == "STALE_CONTRACT_READ"
    sub.refresh_from_db()
    assert (sub.provider_status, sub.entitlement_profile) == ("canceled", "REVOKED")
    moved = subscription_accept_change(subscription_pk=sub.pk, change="contract_update", cause=cause, contract=newer,
                                       expect_contract_revision=sub.contract_revision - 1)
    assert moved.reason == "STALE_CONTRACT_REVISION"


def test_an_unknown_contract_status_is_quarantined_with_its_reason(sim, clock, monkeypatch):
    from dataclasses import replace

    from subscriptions.providers.stripe_adapter import StripeProvider

    _, sub_id = subscribe(sim)
    sim.deliver_all()
    fetch = StripeProvider.fetch_subscription
    monkeypatch.setattr(StripeProvider, "fetch_subscription",
                        lambda self, sid: replace(fetch(self, sid), status="on_hold_by_bank"))
    sim.pause_subscription(sub_id)
    sim.deliver_all()
    event = ProviderEvent.objects.filter(event_type="customer.subscription.updated").latest("pk")
    assert event.outcome == EventOutcome.QUARANTINED and "UNKNOWN_CONTRACT_STATUS" in event.outcome_detail
    assert sub_of(sub_id).entitlement_profile == "FULL", "access unchanged by an unknown status"


# --- 3. a dunning cancellation reaches the provider ---------------------------------------------------


def _canceled_by_policy(sim, clock):
    from tests.support.scenarios import failed_renewal

    _, invoice_id, cycle = failed_renewal(sim)
    clock.move_to(cycle.grace_expires_at + timedelta(minutes=1), tick=True)
    job_run("grace_expiry")
    cycle = cycle_of(invoice_id)
    assert cycle.state == "RESTRICTED"
    clock.move_to(cycle.restricted_at + timedelta(days=30, minutes=1), tick=True)
    return invoice_id


def test_a_policy_cancellation_is_carried_to_the_provider_once_and_confirmed(sim, clock):
    """The provider cancels but its answer is lost (a 500 after applying): the next delivery's
    second DELETE is refused as already canceled, read back, and taken as the confirmation."""
    invoice_id = _canceled_by_policy(sim, clock)
    sim.faults.error_500("DELETE /v1/subscriptions/*", count=1, apply=True)
    job_run("cancellation")
    cycle = cycle_of(invoice_id)
    sub = cycle.subscription
    assert cycle.state == "CANCELED" and sub.provider_cancel_requested_at is not None
    assert sub.provider_cancel_confirmed_at is None, "cancellation requested, not yet confirmed"
    message = OutboxMessage.objects.get(topic="provider.cancel_subscription", subscription=sub)
    first = job_run("outbox_relay")
    sub.refresh_from_db()
    assert first.errors == 1 and sub.provider_cancel_confirmed_at is None
    clock.move_to(sub.provider_cancel_requested_at + timedelta(minutes=5), tick=True)
    job_run("outbox_relay")
    sub.refresh_from_db()
    message.refresh_from_db()
    assert sim.store.objects[sub.provider_subscription_id]["status"] == "canceled"
    assert sub.provider_cancel_confirmed_at is not None and message.published_at is not None
    assert (sub.provider_status, sub.entitlement_profile) == ("canceled", "REVOKED")


def test_an_unconfirmed_provider_cancellation_raises_an_alert_after_an_hour(sim, clock):
    invoice_id = _canceled_by_policy(sim, clock)
    sim.faults.error_500("DELETE /v1/subscriptions/*", count=100)
    job_run("cancellation")
    sub = cycle_of(invoice_id).subscription
    clock.move_to(sub.provider_cancel_requested_at + timedelta(minutes=30), tick=True)
    job_run("alerts")
    assert not Alert.objects.filter(kind="CANCEL_UNCONFIRMED").exists()
    clock.move_to(sub.provider_cancel_requested_at + timedelta(minutes=61), tick=True)
    job_run("alerts")
    alert = Alert.objects.get(kind="CANCEL_UNCONFIRMED")
    assert sub.provider_subscription_id in alert.detail and alert.resolved_at is None
    sim.faults.clear()
    clock.move_to(sub.provider_cancel_requested_at + timedelta(hours=3), tick=True)
    job_run("outbox_relay")
    job_run("alerts")
    alert.refresh_from_db()
    assert alert.resolved_at is not None


def test_the_incident_switch_holds_cancel_pending(sim, clock, staff):
    from dunning.models import IncidentSwitch

    invoice_id = _canceled_by_policy(sim, clock)
    job_run("cancellation")  # moves to CANCELED in one run; set up a CANCEL_PENDING cycle instead
    assert cycle_of(invoice_id).state == "CANCELED"
    second = _canceled_by_policy(sim, clock)
    from tests.support.builders import accept

    assert accept(cycle_of(second), "request_cancellation", cause=Cause.job("cancellation"))
    IncidentSwitch.objects.create(cohort="*", pause_restrictions=True, reason="bad deploy", ticket="INC-1",
                                  started_at=clock_now(), started_by=staff)
    job_run("cancellation")
    cycle = cycle_of(second)
    assert cycle.state == "CANCEL_PENDING"
    refused = Receipt.objects.filter(cycle=cycle, edge="cancel", accepted=False).latest("pk")
    assert refused.rejection_reason == "RESTRICTIONS_PAUSED"


def clock_now():
    from django.utils import timezone

    return timezone.now()


# --- 4. each invoice gets the right policy -------------------------------------------------------------


def test_a_plan_change_rebinds_new_invoices_while_the_open_cycle_keeps_its_policy(sim, clock, shipped_policies):
    _, sub_id, invoice_id = retryable_failure(sim)
    monthly = cycle_of(invoice_id)
    assert monthly.policy.name == "standard-monthly"
    sim.change_price(sub_id, "price_annual_pro", interval="year", amount=49000)
    sim.deliver_all()
    sub = sub_of(sub_id)
    assert (sub.price_id, sub.billing_interval, sub.policy.name) == ("price_annual_pro", "year", "annual-no-grace")
    assert cycle_of(invoice_id).policy_id == monthly.policy_id, "the open cycle keeps the policy it opened under"
    annual_invoice = sim.create_renewal_invoice(sub_id)
    sim.deliver_all()
    annual = cycle_of(annual_invoice)
    assert annual.policy.name == "annual-no-grace" and annual.invoice.price_ids == ["price_annual_pro"]


def test_the_review_verdict_reads_the_invoice_price(sim, clock, shipped_policies):
    from dataclasses import replace

    from dunning.reads.review import subscription_review
    from dunning.reads.verdicts import HOLD_POLICY_NOT_TRANSFERRED, evaluate

    _, sub_id, invoice_id = retryable_failure(sim)
    review = subscription_review(sub_of(sub_id), now=clock_now())
    assert HOLD_POLICY_NOT_TRANSFERRED not in {b.code for b in evaluate(review).blockers}
    copied = replace(review, cycles=tuple(replace(c, invoice_prices=("price_annual_pro",)) for c in review.cycles))
    assert HOLD_POLICY_NOT_TRANSFERRED in {b.code for b in evaluate(copied).blockers}
