"""Local retry dispatch on the clock and PAYMENT_UNKNOWN ownership and resolution (SPEC §9, §10)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from dunning.jobs.framework import job_run
from dunning.models import PaymentAttempt
from dunning.models import TransitionReceipt as Receipt
from tests.support.actors import LEADS, make_staff
from tests.support.scenarios import cycle_of, failed_renewal


@pytest.fixture
def local_in_grace(sim, time_machine):
    time_machine.move_to("2026-12-01T09:00:00Z", tick=True)
    customer, invoice_id, cycle = failed_renewal(sim, price="price_monthly_local", decline="insufficient_funds")
    assert cycle.state == "GRACE_ACTIVE" and cycle.policy.retry_authority == "LOCAL"
    return customer, invoice_id, cycle


@pytest.fixture
def billing_staff(db):
    return [make_staff(name, LEADS) for name in ("ana", "ben")]


def test_local_retry_is_scheduled_by_policy_interval_and_dispatched_when_due(local_in_grace, sim, time_machine):
    customer, invoice_id, _ = local_in_grace
    first = job_run("local_retries")
    cycle = cycle_of(invoice_id)
    assert cycle.state == "RETRY_SCHEDULED" and first.changed == 1
    assert cycle.next_attempt_at == first.run_for + timedelta(minutes=15), "policy's first interval PT15M"
    assert job_run("local_retries").changed == 0, "not due yet"
    sim.set_card(customer, "ok")
    time_machine.move_to(cycle.next_attempt_at + timedelta(seconds=1), tick=True)
    job_run("local_retries")
    cycle = cycle_of(invoice_id)
    assert cycle.state == "RECOVERED" and cycle.subscription.entitlement_profile == "FULL"
    (attempt,) = PaymentAttempt.objects.filter(cycle=cycle, origin="LOCAL")
    assert [c["idempotency_key"] for c in sim.successful_charges(invoice_id)] == [attempt.idempotency_key]


def test_local_retries_stop_at_the_attempt_budget(local_in_grace, time_machine):
    _, invoice_id, _ = local_in_grace
    for _ in range(6):
        job_run("local_retries")
        cycle = cycle_of(invoice_id)
        if cycle.next_attempt_at:
            time_machine.move_to(cycle.next_attempt_at + timedelta(seconds=1), tick=True)
    cycle = cycle_of(invoice_id)
    spec_max = 4  # local-retry-monthly: maxAttempts 4 = the renewal charge + 3 retries
    assert cycle.state == "GRACE_ACTIVE" and cycle.retry_budget_used == spec_max - 1
    assert PaymentAttempt.objects.filter(cycle=cycle, origin="LOCAL").count() == spec_max - 1
    refusals = Receipt.objects.filter(cycle=cycle, accepted=False)
    before = refusals.count()
    for _ in range(3):
        job_run("local_retries")
    assert refusals.count() == before, "the job checks the budget before asking, so reruns add no noise"


def _unknown_after_charge(sim, customer, invoice_id, time_machine):
    job_run("local_retries")
    sim.set_card(customer, "ok")
    time_machine.move_to(cycle_of(invoice_id).next_attempt_at + timedelta(seconds=1), tick=True)
    sim.faults.error_500("POST /v1/invoices/*/pay", apply=True, count=5)
    job_run("local_retries")
    sim.faults.clear()
    cycle = cycle_of(invoice_id)
    assert cycle.state == "PAYMENT_UNKNOWN" and len(sim.successful_charges(invoice_id)) == 1
    return cycle


def test_unknown_payment_gets_an_owner_and_resolves_onto_the_same_attempt(local_in_grace, sim, time_machine,
                                                                          billing_staff):
    customer, invoice_id, _ = local_in_grace
    cycle = _unknown_after_charge(sim, customer, invoice_id, time_machine)
    (attempt,) = PaymentAttempt.objects.filter(cycle=cycle, origin="LOCAL")
    unknown_since = cycle.unknown_since
    time_machine.move_to(unknown_since + timedelta(minutes=5), tick=True)
    job_run("unknown_payments")
    cycle = cycle_of(invoice_id)
    owner_receipt = Receipt.objects.get(cycle=cycle, edge="assign_unknown_owner", accepted=True)
    assert owner_receipt.trusted_time - unknown_since <= timedelta(hours=1)
    assert cycle.unknown_owner in billing_staff
    assert cycle.state == "RECOVERED", "the provider query found the charge"
    attempt.refresh_from_db()
    assert attempt.state == "SUCCEEDED"
    assert PaymentAttempt.objects.filter(cycle=cycle, origin="LOCAL").count() == 1, "never a new attempt"
    assert len(sim.successful_charges(invoice_id)) == 1, "never charged twice"


def test_unknown_payments_are_shared_between_billing_staff_in_turn(sim, time_machine, billing_staff):
    time_machine.move_to("2026-12-01T09:00:00Z", tick=True)
    cycles = []
    for _ in range(2):
        customer, invoice_id, _ = failed_renewal(sim, price="price_monthly_local", decline="insufficient_funds")
        cycles.append((customer, invoice_id))
    job_run("local_retries")
    time_machine.move_to(max(cycle_of(i).next_attempt_at for _, i in cycles) + timedelta(seconds=1), tick=True)
    sim.faults.timeout("POST /v1/invoices/*/pay", apply=False, hold_seconds=2.0, count=2)
    job_run("local_retries")
    sim.faults.error_500("GET /v1/invoices/*", count=20)  # the provider cannot be asked yet
    job_run("unknown_payments")
    owners = {cycle_of(i).unknown_owner for _, i in cycles}
    assert owners == set(billing_staff)
    assert {cycle_of(i).state for _, i in cycles} == {"PAYMENT_UNKNOWN"}, "unknown stays unknown until asked"


def test_unknown_payment_without_staff_raises_an_alert(local_in_grace, sim, time_machine):
    from dunning.models import Alert

    customer, invoice_id, _ = local_in_grace
    cycle = _unknown_after_charge(sim, customer, invoice_id, time_machine)
    sim.faults.error_500("GET /v1/invoices/*", count=20)
    run = job_run("unknown_payments")
    assert run.errors >= 1 and cycle_of(invoice_id).unknown_owner is None
    assert Alert.objects.filter(kind="UNKNOWN_UNOWNED", invoice=cycle.invoice).count() == 1


def test_unknown_payment_is_never_canceled(local_in_grace, sim, time_machine):
    customer, invoice_id, _ = local_in_grace
    cycle = _unknown_after_charge(sim, customer, invoice_id, time_machine)
    sim.faults.error_500("GET /v1/invoices/*", count=50)
    time_machine.move_to(cycle.grace_expires_at + timedelta(days=60), tick=True)
    for job in ("grace_expiry", "restriction", "cancellation"):
        job_run(job)
    assert cycle_of(invoice_id).state == "PAYMENT_UNKNOWN"
