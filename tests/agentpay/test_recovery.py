"""Unknown fulfillment: status query, recovery deadline, needs_review, a lead's resolution."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine

from agentpay.bridge import trusted_now
from agentpay.jobs import agentpay_job_run
from agentpay.models import IntentReceipt, LedgerAccount, PaymentIntent
from agentpay.services.recovery import review_resolve, review_take_ownership
from agentpay.services.results import Refusal

pytestmark = pytest.mark.django_db


def unknown_intent(call, route: str = "boom") -> PaymentIntent:
    response = call(route)
    assert response.status_code in (502, 504)
    return PaymentIntent.objects.get(intent_id=response.json()["intent_id"])


def lines(intent: PaymentIntent) -> tuple[str, str, str]:
    intent.refresh_from_db()
    return intent.state, intent.settlements.get().state, intent.fulfillment.state


def available(tenant) -> int:
    return LedgerAccount.objects.get(kind="wallet", tenant=tenant).available


def test_status_query_succeeded_captures(funded, routes, upstream, call):
    intent = unknown_intent(call)  # /boom acted, then answered 503
    run = agentpay_job_run("agentpay_fulfillment_status_query")
    assert run.changed == 1
    assert lines(intent) == ("completed", "confirmed", "succeeded")
    assert available(funded) == 850
    assert len(upstream.calls) == 1  # asked, never called again


def test_status_query_failed_releases(funded, routes, upstream, call):
    intent = unknown_intent(call)
    upstream.status_override[intent.fulfillment.fulfillment_id] = "failed"
    agentpay_job_run("agentpay_fulfillment_status_query")
    assert lines(intent) == ("failed", "released", "failed")
    assert available(funded) == 1000


@pytest.mark.parametrize("answer", ["not_found", "in_progress"])
def test_status_query_without_proof_stays_unknown(funded, routes, upstream, call, answer):
    intent = unknown_intent(call)
    upstream.status_override[intent.fulfillment.fulfillment_id] = answer
    run = agentpay_job_run("agentpay_fulfillment_status_query")
    assert run.changed == 0
    assert lines(intent) == ("authorized", "held", "unknown")
    intent.fulfillment.refresh_from_db()
    assert intent.fulfillment.last_status_query_answer == answer


def test_deadline_sends_to_review_with_an_owner_and_a_lead_resolves(funded, routes, upstream, call, lead):
    intent = unknown_intent(call)
    upstream.status_override[intent.fulfillment.fulfillment_id] = "in_progress"
    early = agentpay_job_run("agentpay_recovery_deadline")
    assert early.examined == 0 and lines(intent)[0] == "authorized"
    with time_machine.travel(trusted_now() + timedelta(minutes=16), tick=False):
        run = agentpay_job_run("agentpay_recovery_deadline")
    assert lines(intent) == ("needs_review", "held", "unknown")
    intent.refresh_from_db()
    assert intent.review_owner == lead
    assert available(funded) == 850  # the hold is kept
    with pytest.raises(Refusal):
        review_take_ownership(intent_id=intent.intent_id, user=lead, reason="", ticket="")
    refused = review_resolve(intent_id=intent.intent_id, delivered=True, user=lead, reason="checked", ticket="")
    assert not refused.accepted and refused.refusal_code == "REASON_AND_TICKET_REQUIRED"
    outcome = review_resolve(intent_id=intent.intent_id, delivered=True, user=lead, reason="upstream log shows it",
                             ticket="OPS-7")
    # The lead attests delivery (source manual), then capture, then the resolution: no capture
    # while the fulfillment is unknown, even for a person (the spec's C03).
    assert outcome.accepted and outcome.display_status == "COMPLETED"
    assert lines(intent) == ("completed", "confirmed", "succeeded")
    attested = IntentReceipt.objects.get(intent=intent, event="upstream_status_query_ok", accepted=True)
    assert (attested.data["source"], attested.actor, attested.ticket) == ("manual", "user:lead", "OPS-7")
    assert available(funded) == 850 and run.changed == 2


def test_not_delivered_releases(funded, routes, upstream, call, lead):
    intent = unknown_intent(call, "hang")
    upstream.status_override[intent.fulfillment.fulfillment_id] = "not_found"
    with time_machine.travel(trusted_now() + timedelta(minutes=16), tick=False):
        agentpay_job_run("agentpay_recovery_deadline")
    outcome = review_resolve(intent_id=intent.intent_id, delivered=False, user=lead, reason="never arrived",
                             ticket="OPS-8")
    assert outcome.accepted and lines(intent) == ("failed", "released", "failed")
    assert available(funded) == 1000


def test_a_staff_member_without_the_permission_cannot_resolve(funded, routes, upstream, call, django_user_model):
    intent = unknown_intent(call)
    upstream.status_override[intent.fulfillment.fulfillment_id] = "in_progress"
    with time_machine.travel(trusted_now() + timedelta(minutes=16), tick=False):
        agentpay_job_run("agentpay_recovery_deadline")
    clerk = django_user_model.objects.create_user("clerk", is_staff=True)
    outcome = review_resolve(intent_id=intent.intent_id, delivered=True, user=clerk, reason="r", ticket="t")
    assert not outcome.accepted and outcome.refusal_code == "NOT_PERMITTED"
    assert IntentReceipt.objects.filter(intent=intent, refusal_code="NOT_PERMITTED").exists()


def test_a_job_ahead_of_the_trusted_clock_does_nothing(funded, routes, call):
    intent = unknown_intent(call)
    run = agentpay_job_run("agentpay_recovery_deadline", now=trusted_now() + timedelta(hours=1))
    assert run.refused == 1 and lines(intent)[0] == "authorized"
