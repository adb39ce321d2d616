"""Local retries (SPEC §9): key persisted before dispatch, one charge whatever fails, unknown
outcomes resolved by asking the provider with the same key."""

from __future__ import annotations

import pytest

from dunning.acceptance.inputs import Cause
from dunning.actions.local_retry import retry_dispatch, retry_resolve
from dunning.models import DunningCycle, PaymentAttempt
from subscriptions.providers.registry import get_provider
from tests.support.builders import accept, reload

JOB = Cause.job("local_retry")


@pytest.fixture
def failing_local_cycle(sim):
    """A LOCAL-policy subscription whose renewal charge failed: cycle in GRACE, retry scheduled."""
    customer = sim.create_customer("local@example.com", card="ok")
    sub_id = sim.create_subscription(customer, "price_monthly_local", amount=3000)
    sim.set_card(customer, "insufficient_funds")
    invoice_id = sim.create_renewal_invoice(sub_id)
    sim.provider_attempt(invoice_id)
    sim.deliver_all()
    cycle = DunningCycle.objects.get(invoice__provider_invoice_id=invoice_id)
    assert cycle.state == "GRACE_ACTIVE" and cycle.policy.retry_authority == "LOCAL"
    assert accept(cycle, "schedule_retry", cause=JOB).accepted
    sim.set_card(customer, "ok")
    return sim, reload(cycle), customer


def local_attempts(cycle):
    return list(PaymentAttempt.objects.filter(cycle=cycle, origin="LOCAL"))


def charges(sim, cycle):
    return sim.successful_charges(cycle.invoice.provider_invoice_id)


def test_successful_local_retry_recovers_with_one_charge(failing_local_cycle):
    sim, cycle, _ = failing_local_cycle
    outcome = retry_dispatch(cycle_pk=cycle.pk, cause=JOB)
    assert outcome.status == "PAID", outcome
    cycle = reload(cycle)
    assert cycle.state == "RECOVERED" and cycle.subscription.entitlement_profile == "FULL"
    (attempt,) = local_attempts(cycle)
    assert attempt.state == "SUCCEEDED"
    assert [c["idempotency_key"] for c in charges(sim, cycle)] == [attempt.idempotency_key]


def test_declined_local_retry_goes_back_to_grace_and_schedules_the_next_interval(failing_local_cycle):
    sim, cycle, customer = failing_local_cycle
    sim.set_card(customer, "insufficient_funds")
    outcome = retry_dispatch(cycle_pk=cycle.pk, cause=JOB)
    assert outcome.status == "DECLINED" and outcome.detail == "insufficient_funds"
    cycle = reload(cycle)
    assert cycle.state == "RETRY_SCHEDULED" and cycle.retry_budget_used == 1
    assert local_attempts(cycle)[0].state == "FAILED"
    assert charges(sim, cycle) == []


def test_hard_decline_on_local_retry_stops_retrying(failing_local_cycle):
    sim, cycle, customer = failing_local_cycle
    sim.set_card(customer, "stolen_card")
    assert retry_dispatch(cycle_pk=cycle.pk, cause=JOB).status == "DECLINED"
    cycle = reload(cycle)
    assert cycle.state == "GRACE_ACTIVE" and cycle.customer_action_required and cycle.next_attempt_at is None


def test_indeterminate_500_after_charge_becomes_unknown_then_resolves_with_one_charge(failing_local_cycle):
    sim, cycle, _ = failing_local_cycle
    sim.faults.error_500("POST /v1/invoices/*/pay", apply=True)
    outcome = retry_dispatch(cycle_pk=cycle.pk, cause=JOB)
    assert outcome.status == "UNKNOWN"
    cycle = reload(cycle)
    assert cycle.state == "PAYMENT_UNKNOWN"
    assert len(charges(sim, cycle)) == 1, "the provider did charge"
    assert cycle.subscription.entitlement_profile != "FULL", "unknown is not success"
    resolved = retry_resolve(cycle_pk=cycle.pk, cause=JOB)
    assert resolved.status == "PAID"
    cycle = reload(cycle)
    assert cycle.state == "RECOVERED" and len(charges(sim, cycle)) == 1
    assert len(local_attempts(cycle)) == 1


@pytest.mark.parametrize("applied", [True, False])
def test_timeout_is_resolved_with_the_same_key_never_a_new_one(failing_local_cycle, applied):
    sim, cycle, _ = failing_local_cycle
    sim.faults.timeout("POST /v1/invoices/*/pay", apply=applied, hold_seconds=3)
    assert retry_dispatch(cycle_pk=cycle.pk, cause=JOB).status == "UNKNOWN"
    cycle = reload(cycle)
    assert cycle.state == "PAYMENT_UNKNOWN"
    assert len(charges(sim, cycle)) == (1 if applied else 0)
    if applied:
        sim.faults.stale_read(cycle.invoice.provider_invoice_id)  # the first query still shows it open
    assert retry_resolve(cycle_pk=cycle.pk, cause=JOB).status == "PAID"
    cycle = reload(cycle)
    (attempt,) = local_attempts(cycle)
    assert [c["idempotency_key"] for c in charges(sim, cycle)] == [attempt.idempotency_key]


def test_crash_before_dispatch_reuses_the_persisted_key(failing_local_cycle):
    sim, cycle, _ = failing_local_cycle
    assert accept(cycle, "prepare_retry", cause=JOB).accepted  # ...and the worker dies here
    prepared = local_attempts(cycle)[0]
    assert prepared.state == "PREPARED"
    assert retry_dispatch(cycle_pk=cycle.pk, cause=JOB).status == "PAID"
    cycle = reload(cycle)
    assert [a.pk for a in local_attempts(cycle)] == [prepared.pk]
    assert [c["idempotency_key"] for c in charges(sim, cycle)] == [prepared.idempotency_key]


def test_crash_after_provider_charged_before_result_recorded(failing_local_cycle):
    sim, cycle, _ = failing_local_cycle
    assert accept(cycle, "prepare_retry", cause=JOB).accepted
    assert accept(cycle, "dispatch_retry", cause=JOB).accepted
    attempt = local_attempts(cycle)[0]
    get_provider().pay_invoice(cycle.invoice.provider_invoice_id, idempotency_key=attempt.idempotency_key)
    # ...the worker dies before recording the result. The next run finds RETRY_DISPATCHING.
    assert reload(cycle).state == "RETRY_DISPATCHING"
    assert retry_dispatch(cycle_pk=cycle.pk, cause=JOB).status == "PAID"
    cycle = reload(cycle)
    assert cycle.state == "RECOVERED" and len(charges(sim, cycle)) == 1
    assert local_attempts(cycle)[0].state == "SUCCEEDED"


def test_retry_is_refused_while_an_attempt_is_pending_or_unknown(failing_local_cycle):
    sim, cycle, _ = failing_local_cycle
    sim.faults.error_500("POST /v1/invoices/*/pay", apply=False)
    assert retry_dispatch(cycle_pk=cycle.pk, cause=JOB).status == "UNKNOWN"
    cycle = reload(cycle)
    refused = accept(cycle, "prepare_retry", cause=JOB)
    assert not refused.accepted and refused.reason == "EDGE_NOT_ALLOWED"
    assert len(local_attempts(cycle)) == 1
