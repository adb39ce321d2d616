""""Retry now" (SPEC §9): the local retry path, refused in plain words while an attempt is
pending or unknown, for provider-owned retries and for hard declines."""

from __future__ import annotations

import pytest

from dunning.acceptance.inputs import Cause
from dunning.actions.retry_now import REFUSAL_TEXT, cycle_retry_now
from dunning.models import PaymentAttempt
from tests.support.scenarios import cycle_of, failed_renewal


@pytest.fixture
def customer_cause(django_user_model):
    return Cause.customer(django_user_model.objects.create_user("payer", password="x"))


def test_retry_now_charges_once_through_the_persisted_attempt(sim, customer_cause):
    customer, invoice_id, cycle = failed_renewal(sim, price="price_monthly_local", decline="insufficient_funds")
    sim.set_card(customer, "ok")
    outcome = cycle_retry_now(cycle_pk=cycle.pk, cause=customer_cause)
    assert outcome.status == "PAID", outcome
    cycle = cycle_of(invoice_id)
    assert cycle.state == "RECOVERED"
    (attempt,) = PaymentAttempt.objects.filter(cycle=cycle, origin="LOCAL")
    assert [c["idempotency_key"] for c in sim.successful_charges(invoice_id)] == [attempt.idempotency_key]


def test_retry_now_is_refused_while_the_outcome_is_unknown(sim, customer_cause):
    customer, invoice_id, cycle = failed_renewal(sim, price="price_monthly_local", decline="insufficient_funds")
    sim.set_card(customer, "ok")
    sim.faults.error_500("POST /v1/invoices/*/pay", apply=True, count=5)
    assert cycle_retry_now(cycle_pk=cycle.pk, cause=customer_cause).status == "UNKNOWN"
    sim.faults.clear()
    again = cycle_retry_now(cycle_pk=cycle.pk, cause=customer_cause)
    assert (again.status, again.code) == ("REFUSED", "ATTEMPT_IN_PROGRESS")
    assert "not charge you again" in again.detail
    assert len(sim.successful_charges(invoice_id)) == 1
    assert PaymentAttempt.objects.filter(cycle=cycle_of(invoice_id), origin="LOCAL").count() == 1


def test_retry_now_is_refused_for_provider_owned_retries(sim, customer_cause):
    _, _, cycle = failed_renewal(sim, decline="insufficient_funds")
    outcome = cycle_retry_now(cycle_pk=cycle.pk, cause=customer_cause)
    assert (outcome.status, outcome.code) == ("REFUSED", "RETRY_AUTHORITY_IS_PROVIDER")
    assert outcome.detail == REFUSAL_TEXT["RETRY_AUTHORITY_IS_PROVIDER"]


def test_retry_now_is_refused_after_a_hard_decline(sim, customer_cause):
    _, invoice_id, cycle = failed_renewal(sim, price="price_monthly_local", decline="stolen_card")
    outcome = cycle_retry_now(cycle_pk=cycle.pk, cause=customer_cause)
    assert (outcome.status, outcome.code) == ("REFUSED", "NON_RETRYABLE_NO_RETRY")
    assert "update your payment method" in outcome.detail
    assert sim.successful_charges(invoice_id) == []
