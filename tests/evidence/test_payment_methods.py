"""A new payment method answers a hard decline (issue 15, item 4): fetched fresh after
`customer.updated`, `payment_method.attached` or `setup_intent.succeeded`, it clears
`customer_action_required` through the acceptance service, once; under LOCAL authority the
local_retries job then retries on the persisted-key path, under provider authority nothing is
charged here and the provider's own retry is the evidence."""

from __future__ import annotations

from datetime import timedelta

import pytest

from dunning.acceptance.edges import local_idempotency_key
from dunning.acceptance.inputs import Evidence
from dunning.evidence.payment_methods import PAYMENT_METHOD_EVENT_TYPES, customer_payment_method_refresh
from dunning.evidence.receipts import receipt_record
from dunning.jobs.framework import job_run
from dunning.models import EventOutcome, PaymentAttempt, ProviderEvent, ProviderReceipt
from dunning.models import TransitionReceipt as Receipt
from tests.support.builders import accept, fail_first_payment, make_subscription, open_cycle, reload
from tests.support.scenarios import JOB, cycle_of, failed_renewal


def clears(cycle) -> list[Receipt]:
    return list(Receipt.objects.filter(cycle=cycle, edge="clear_customer_action").order_by("pk"))


def method_events(sim) -> list[ProviderEvent]:
    return list(ProviderEvent.objects.filter(event_type__in=PAYMENT_METHOD_EVENT_TYPES).order_by("pk"))


@pytest.mark.parametrize("api_shape", ["current", "legacy"], indirect=True)
def test_a_new_card_clears_the_hard_decline_once_and_the_providers_retry_is_the_evidence(sim, api_shape):
    customer, invoice_id, cycle = failed_renewal(sim, decline="stolen_card")
    assert cycle.customer_action_required and cycle.failure_class == "NON_RETRYABLE"
    sub = cycle.subscription
    profile, generation = sub.entitlement_profile, sub.entitlement_generation

    new_method = sim.update_payment_method(customer, "ok")
    sim.deliver_all()

    after = cycle_of(invoice_id)
    assert not after.customer_action_required and after.failure_class == ""
    assert after.state == "GRACE_ACTIVE" and after.generation == cycle.generation + 1
    (cleared,) = clears(after)
    assert cleared.accepted and new_method in cleared.detail
    assert (cleared.evidence_receipt.object_type, cleared.evidence_receipt.object_id) == ("customer", customer)
    events = method_events(sim)
    assert sorted(e.event_type for e in events) == sorted(PAYMENT_METHOD_EVENT_TYPES)
    assert sorted(e.outcome for e in events) == [EventOutcome.APPLIED, EventOutcome.NO_CHANGE,
                                                 EventOutcome.NO_CHANGE]
    assert all(e.subscription_id == sub.pk for e in events), "every event is attributed"
    # Nothing is charged here and access waits for money.
    assert sim.successful_charges(invoice_id) == []
    assert not PaymentAttempt.objects.filter(cycle=after, origin="LOCAL").exists()
    after.subscription.refresh_from_db()
    assert (after.subscription.entitlement_profile, after.subscription.entitlement_generation) == (profile,
                                                                                                  generation)

    # The provider schedules its own retry of the new card: evidence now, not refused as before.
    sim.reschedule(invoice_id, sim.now_ts() + 3600)
    sim.deliver_all()
    assert cycle_of(invoice_id).state == "RETRY_SCHEDULED"
    sim.provider_attempt(invoice_id)
    sim.deliver_all()
    recovered = cycle_of(invoice_id)
    assert recovered.state == "RECOVERED" and recovered.subscription.entitlement_profile == "FULL"
    assert len(sim.successful_charges(invoice_id)) == 1


def test_the_declined_card_still_on_file_changes_nothing(sim):
    customer, invoice_id, cycle = failed_renewal(sim, decline="stolen_card")
    sim.update_customer(customer, email="new-address@example.com")  # customer.updated, same card
    sim.update_payment_method(customer, "ok", make_default=False)  # attached, but not the default
    sim.deliver_all()
    after = cycle_of(invoice_id)
    assert after.customer_action_required and after.failure_class == "NON_RETRYABLE"
    assert after.generation == cycle.generation
    assert clears(after) == [], "not even a rejection: nothing new was seen"
    events = method_events(sim)
    assert len(events) == 3 and {e.outcome for e in events} == {EventOutcome.NO_CHANGE}
    assert ProviderReceipt.objects.filter(object_type="customer", object_id=customer).count() == 3


def test_the_same_card_seen_twice_changes_nothing_even_when_it_is_declined_again(sim):
    customer, invoice_id, cycle = failed_renewal(sim, decline="stolen_card")
    sim.update_payment_method(customer, "lost_card")  # the new card will be declined for good too
    sim.deliver_all()
    cleared = cycle_of(invoice_id)
    assert not cleared.customer_action_required
    again = customer_payment_method_refresh(provider_customer_id=customer, cause=JOB)
    assert again.results == [] and cycle_of(invoice_id).generation == cleared.generation

    # The provider tries the new card: a hard decline again, so the customer must act again,
    # and seeing that same card once more (an unrelated customer.updated) does not clear it.
    sim.reschedule(invoice_id, sim.now_ts() + 60)
    sim.deliver_all()
    sim.provider_attempt(invoice_id)
    sim.deliver_all()
    declined_again = cycle_of(invoice_id)
    assert declined_again.customer_action_required and declined_again.decline_code == "lost_card"
    sim.update_customer(customer, name="Same Card")
    sim.deliver_all()
    assert cycle_of(invoice_id).customer_action_required
    assert [r.accepted for r in clears(declined_again)] == [True]
    assert sim.successful_charges(invoice_id) == []


@pytest.fixture
def local_hard_decline(sim, time_machine):
    time_machine.move_to("2026-12-01T09:00:00Z", tick=True)
    customer, invoice_id, cycle = failed_renewal(sim, price="price_monthly_local", decline="stolen_card")
    assert cycle.policy.retry_authority == "LOCAL" and cycle.customer_action_required
    return customer, invoice_id, cycle


def test_under_local_authority_a_new_card_is_retried_by_the_job_on_the_persisted_key_path(
        sim, local_hard_decline, time_machine):
    customer, invoice_id, cycle = local_hard_decline
    assert job_run("local_retries").changed == 0, "a hard decline is never retried"
    sim.update_payment_method(customer, "ok")
    sim.deliver_all()
    assert cycle_of(invoice_id).state == "GRACE_ACTIVE", "clearing schedules nothing by itself"
    assert sim.successful_charges(invoice_id) == []

    scheduled = job_run("local_retries")
    cycle = cycle_of(invoice_id)
    assert scheduled.changed == 1 and cycle.state == "RETRY_SCHEDULED"
    assert cycle.next_attempt_at == scheduled.run_for + timedelta(minutes=15), "the policy's first interval"
    time_machine.move_to(cycle.next_attempt_at + timedelta(seconds=1), tick=True)
    job_run("local_retries")
    cycle = cycle_of(invoice_id)
    assert cycle.state == "RECOVERED" and cycle.subscription.entitlement_profile == "FULL"
    (attempt,) = PaymentAttempt.objects.filter(cycle=cycle, origin="LOCAL")
    assert attempt.idempotency_key == local_idempotency_key(cycle.cycle_id, 2)
    assert [c["idempotency_key"] for c in sim.successful_charges(invoice_id)] == [attempt.idempotency_key]


def test_a_customer_we_do_not_know_is_ignored_not_unattributed(sim):
    stranger = sim.create_customer("stranger@example.com")
    sim.update_payment_method(stranger, "ok")
    sim.deliver_all()
    assert {e.outcome for e in method_events(sim)} == {EventOutcome.IGNORED}


# --- the edge's own guards (acceptance refuses and records why) ---------------------------------

@pytest.fixture
def waiting_cycle(policy):
    sub = make_subscription()
    cycle = open_cycle(sub)
    fail_first_payment(cycle, decline_code="stolen_card")
    cycle = reload(cycle)
    assert cycle.customer_action_required
    return cycle


def customer_receipt(customer_id: str, **fetched):
    return receipt_record(object_type="customer", body={"id": customer_id, "object": "customer"}, **fetched)


def test_clearing_needs_a_fresh_receipt_of_this_customer_and_a_different_card(waiting_cycle):
    own = waiting_cycle.subscription.customer.provider_customer_id
    ask = {"payment_method": "pm_new", "declined_payment_method": "pm_old"}
    refusals = {
        "CUSTOMER_RECEIPT_REQUIRED": accept(waiting_cycle, "clear_customer_action", **ask),
        "RECEIPT_NOT_FOR_THIS_CUSTOMER": accept(waiting_cycle, "clear_customer_action",
                                                evidence=Evidence(receipt=customer_receipt("cus_other")), **ask),
        "SAME_PAYMENT_METHOD": accept(waiting_cycle, "clear_customer_action",
                                      evidence=Evidence(receipt=customer_receipt(own)),
                                      payment_method="pm_old", declined_payment_method="pm_old"),
    }
    assert {code: r.reason for code, r in refusals.items()} == {code: code for code in refusals}
    assert reload(waiting_cycle).customer_action_required
    assert Receipt.objects.filter(cycle=waiting_cycle, edge="clear_customer_action", accepted=False).count() == 3

    cleared = accept(waiting_cycle, "clear_customer_action", evidence=Evidence(receipt=customer_receipt(own)), **ask)
    assert cleared.accepted and cleared.to_state == "GRACE_ACTIVE"
    twice = accept(waiting_cycle, "clear_customer_action", evidence=Evidence(receipt=customer_receipt(own)), **ask)
    assert twice.reason == "NO_CUSTOMER_ACTION_REQUIRED"
