"""Quarantine is not a grave (issue 15, item 1): a billing lead has a held provider event fetched
again and re-processed — through the normal processing path on a fresh receipt, with reason and
ticket, the first verdict kept on record — over the API and through the service. The Stripe
simulator is the provider."""

from __future__ import annotations

import contextlib
import functools

import pytest
from django.db import connection

from dunning.clock import trusted_now
from dunning.evidence import reprocessing as event_requeue
from dunning.evidence.processing import event_process
from dunning.evidence.reprocessing import ReprocessRefused, event_reprocess
from dunning.models import DunningCycle, EventOutcome, FactKind, MonetaryFact, ProviderEvent, ProviderReceipt
from dunning.models.inbox import EventReprocessing, ReprocessingStatus
from subscriptions.models import Subscription
from tests.support.scenarios import bring_back, failed_renewal_quarantined, hide
from tests.support.threads import run_together

URL = "/api/v1/events/{}/reprocess"
BODY = {"reason": "Provider confirmed the invoice exists now (replica lag)", "ticket": "OPS-88"}


@contextlib.contextmanager
def provider_lost(sim, object_id):
    """The provider's API answers 404 for the object (a lagging read replica) while inside."""
    hidden = hide(sim, object_id)
    try:
        yield
    finally:
        bring_back(sim, hidden)


def post(client, event, body=BODY, key="rp-1"):
    return client.post(URL.format(event.event_id), body, format="json", HTTP_IDEMPOTENCY_KEY=key)


def test_a_lead_reprocesses_an_invoice_event_the_provider_now_has(sim, lead, lead_client):
    sub_id, invoice, event = failed_renewal_quarantined(sim)
    sub = Subscription.objects.get(provider_subscription_id=sub_id)
    assert sub.entitlement_profile == "FULL", "a held event changed nobody's access"
    first_processed_at = event.processed_at
    bring_back(sim, invoice)

    response = post(lead_client, event)

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["still_held"] is False
    assert body["event"]["outcome"] == "APPLIED" and body["event"]["held"] is False
    assert body["event"]["subscription"] == sub_id and body["event"]["invoice"] == invoice["id"]
    audit = body["reprocessing"]
    assert (audit["actor"], audit["reason"], audit["ticket"]) == ("lead", BODY["reason"], "OPS-88")
    assert audit["previous_outcome"] == "QUARANTINED"
    assert audit["previous_detail"] == f"provider has no invoice {invoice['id']}"
    assert audit["status"] == "DONE" and audit["new_outcome"] == "APPLIED"
    assert "QUARANTINED → APPLIED" in body["summary"]

    cycle = DunningCycle.objects.select_related("subscription").get(invoice__provider_invoice_id=invoice["id"])
    assert cycle.state in ("GRACE_ACTIVE", "RETRY_SCHEDULED")
    assert cycle.subscription.entitlement_profile == "READ_EXPORT_NO_NEW_JOBS"
    assert MonetaryFact.objects.filter(invoice=cycle.invoice, kind=FactKind.PAYMENT_FAILED).exists()
    fresh = ProviderReceipt.objects.filter(cause_event=event, object_type="invoice", invoice=cycle.invoice)
    assert fresh.exists(), "the decision cites a fresh fetch of the invoice"

    row = EventReprocessing.objects.get(event=event)
    assert (row.requested_by, row.previous_processed_at, row.finished_at is not None) == (lead, first_processed_at,
                                                                                         True)
    event.refresh_from_db()
    assert event.outcome == EventOutcome.APPLIED and event.processed_at > first_processed_at
    assert event.cycle_id == cycle.pk and event.subscription_id == cycle.subscription_id


def test_the_fresh_receipt_decides_not_the_event_body(sim, lead_client):
    """The held event says payment_failed; meanwhile the customer paid. Re-processing fetches the
    invoice (paid) and nobody loses access."""
    sub_id, invoice, event = failed_renewal_quarantined(sim)
    bring_back(sim, invoice)
    sim.customer_pays(invoice["id"], update_card=True)  # its events are not delivered

    response = post(lead_client, event)

    assert response.status_code == 200, response.content
    assert response.json()["event"]["outcome"] == "APPLIED"
    cycle = DunningCycle.objects.select_related("subscription").get(invoice__provider_invoice_id=invoice["id"])
    assert cycle.state == "RECOVERED", "the fresh receipt shows the invoice paid"
    assert cycle.subscription.entitlement_profile == "FULL"
    assert MonetaryFact.objects.filter(invoice=cycle.invoice, kind=FactKind.PAYMENT_SUCCEEDED).exists()


def test_still_missing_stays_held_and_every_verdict_stays_on_record(sim, lead_client):
    _, invoice, event = failed_renewal_quarantined(sim)

    still = post(lead_client, event, key="rp-a")
    assert still.status_code == 200, still.content
    assert still.json()["still_held"] is True and still.json()["event"]["outcome"] == "QUARANTINED"
    assert "still held" in still.json()["summary"]

    bring_back(sim, invoice)
    done = post(lead_client, event, {**BODY, "ticket": "OPS-89"}, key="rp-b")
    assert done.status_code == 200 and done.json()["event"]["outcome"] == "APPLIED"

    rows = list(EventReprocessing.objects.filter(event=event).order_by("pk")
                .values_list("ticket", "previous_outcome", "new_outcome", "status"))
    assert rows == [("OPS-88", "QUARANTINED", "QUARANTINED", "DONE"), ("OPS-89", "QUARANTINED", "APPLIED", "DONE")]


def test_an_event_that_is_not_held_is_409_in_plain_words(sim, lead_client):
    _, invoice, event = failed_renewal_quarantined(sim)
    applied = ProviderEvent.objects.filter(outcome=EventOutcome.APPLIED).first()
    assert applied is not None

    response = post(lead_client, applied)

    assert response.status_code == 409 and response["Content-Type"] == "application/problem+json"
    problem = response.json()
    assert problem["type"].endswith("/not-held") and problem["code"] == "NOT_HELD"
    assert f"Event {applied.event_id} is not held: it was processed on" in problem["detail"]
    assert "as APPLIED" in problem["detail"]
    assert not EventReprocessing.objects.exists()


def test_unknown_event_is_404_and_input_is_checked(sim, lead_client):
    _, invoice, event = failed_renewal_quarantined(sim)
    missing = lead_client.post(URL.format("evt_nobody_sent"), BODY, format="json", HTTP_IDEMPOTENCY_KEY="x-1")
    assert missing.status_code == 404 and missing.json()["type"].endswith("/not-found")
    by_pk = lead_client.post(URL.format(event.pk), {"reason": " ", "ticket": "T"}, format="json",
                             HTTP_IDEMPOTENCY_KEY="x-2")
    assert by_pk.status_code == 400 and [e["field"] for e in by_pk.json()["errors"]] == ["reason"]
    no_key = lead_client.post(URL.format(event.event_id), BODY, format="json")
    assert no_key.status_code == 400 and no_key.json()["type"].endswith("/idempotency-key-required")
    assert not EventReprocessing.objects.exists()


def test_only_billing_leads_may_reprocess(sim, agent_client, token_client, client):
    _, invoice, event = failed_renewal_quarantined(sim)
    bring_back(sim, invoice)
    assert post(agent_client, event).status_code == 403
    assert post(token_client(scopes=("billing:read",)), event).status_code == 403
    client.logout()
    anonymous = client.post(URL.format(event.event_id), BODY, content_type="application/json",
                            HTTP_IDEMPOTENCY_KEY="a-1")
    assert anonymous.status_code == 401
    assert not EventReprocessing.objects.exists()
    assert ProviderEvent.objects.get(pk=event.pk).outcome == EventOutcome.QUARANTINED


def test_a_repeat_with_the_same_key_replays_and_reprocesses_once(sim, lead_client):
    _, invoice, event = failed_renewal_quarantined(sim)
    bring_back(sim, invoice)
    first = post(lead_client, event, key="same")
    again = post(lead_client, event, key="same")
    assert first.status_code == again.status_code == 200
    assert again["Idempotent-Replayed"] == "true" and again.json() == first.json()
    assert EventReprocessing.objects.filter(event=event).count() == 1
    other = post(lead_client, event, {**BODY, "ticket": "OPS-2"}, key="same")
    assert other.status_code == 422


def test_the_provider_not_answering_changes_nothing_and_the_same_key_may_retry(sim, lead_client):
    _, invoice, event = failed_renewal_quarantined(sim)
    bring_back(sim, invoice)
    sim.faults.error_500(f"GET /v1/invoices/{invoice['id']}", count=10)

    down = post(lead_client, event, key="k-down")

    assert down.status_code == 503, down.content
    assert down["Retry-After"] == "60" and down.json()["type"].endswith("/provider-unavailable")
    assert "Nothing changed" in down.json()["detail"]
    assert ProviderEvent.objects.get(pk=event.pk).outcome == EventOutcome.QUARANTINED
    (row,) = EventReprocessing.objects.filter(event=event)
    assert row.status == ReprocessingStatus.PROVIDER_UNAVAILABLE and row.new_outcome == ""

    sim.faults.clear()
    up = post(lead_client, event, key="k-down")
    assert up.status_code == 200 and up.json()["event"]["outcome"] == "APPLIED"


def test_an_event_for_a_subscription_the_provider_did_not_have_is_imported_on_reprocessing(sim, lead):
    customer = sim.create_customer("new@example.com", card="ok")
    sub_id = sim.create_subscription(customer, "price_monthly_pro", amount=4900)
    with provider_lost(sim, sub_id):
        sim.deliver_all()
    event = ProviderEvent.objects.get(event_type="customer.subscription.created", payload__data__object__id=sub_id)
    assert (event.outcome, event.outcome_detail) == ("QUARANTINED", f"provider has no subscription {sub_id}")
    assert not Subscription.objects.filter(provider_subscription_id=sub_id).exists()

    outcome = event_reprocess(event_pk=event.pk, user=lead, reason="subscription exists now", ticket="OPS-5")

    assert outcome.provider_answered and not outcome.still_held
    assert outcome.event.outcome == EventOutcome.APPLIED
    assert outcome.event.outcome_detail == "imported with its first snapshot"
    sub = Subscription.objects.get(provider_subscription_id=sub_id)
    assert (sub.entitlement_profile, sub.entitlement_generation) == ("FULL", 1)


# --------------------------------------------------------------------------- the service itself


def test_an_unattributable_payment_is_fetched_again_and_stays_held_while_nobody_knows_it(sim, lead):
    event = ProviderEvent.objects.create(
        event_id="evt_orphan_payment", event_type="payment_intent.succeeded", account="acct_demo",
        payload={"id": "evt_orphan_payment", "type": "payment_intent.succeeded",
                 "data": {"object": {"id": "pi_nobody_knows", "object": "payment_intent"}}},
        signature_verified=True, received_at=trusted_now(),
    )
    assert event_process(event_pk=event.pk) == EventOutcome.UNATTRIBUTABLE
    outcome = event_reprocess(event_pk=event.pk, user=lead, reason="customer says they paid", ticket="SUP-1")
    assert outcome.still_held and outcome.event.outcome == EventOutcome.UNATTRIBUTABLE
    assert outcome.attempt.previous_outcome == outcome.attempt.new_outcome == "UNATTRIBUTABLE"
    assert "not linked to any invoice we know" in outcome.attempt.new_detail


def test_reason_and_ticket_are_required_by_the_service(sim, lead):
    _, invoice, event = failed_renewal_quarantined(sim)
    with pytest.raises(ReprocessRefused) as refused:
        event_reprocess(event_pk=event.pk, user=lead, reason="  ", ticket="T-1")
    assert refused.value.code == "REASON_AND_TICKET_REQUIRED"
    assert not EventReprocessing.objects.exists()


def test_one_reprocessing_at_a_time_and_a_dead_one_is_abandoned(sim, lead, settings):
    _, invoice, event = failed_renewal_quarantined(sim)
    bring_back(sim, invoice)
    running = EventReprocessing.objects.create(
        event=event, requested_by=lead, actor="lead", reason="r", ticket="T", requested_at=trusted_now(),
        previous_outcome=event.outcome, previous_detail=event.outcome_detail)
    with pytest.raises(ReprocessRefused) as refused:
        event_reprocess(event_pk=event.pk, user=lead, reason="again", ticket="T-2")
    assert refused.value.code == "REPROCESSING_IN_PROGRESS" and "lead started re-processing" in refused.value.detail

    settings.DUNNING_REPROCESS_STALE_SECONDS = 0
    outcome = event_reprocess(event_pk=event.pk, user=lead, reason="again", ticket="T-2")
    assert outcome.event.outcome == EventOutcome.APPLIED
    running.refresh_from_db()
    assert running.status == ReprocessingStatus.ABANDONED and running.finished_at is not None


def test_a_failure_on_our_side_is_recorded_and_the_event_keeps_its_outcome(sim, lead, monkeypatch):
    _, invoice, event = failed_renewal_quarantined(sim)

    def broken(*args, **kwargs):
        raise RuntimeError("database fell over")

    monkeypatch.setattr(event_requeue, "event_process_fresh", broken)
    with pytest.raises(RuntimeError):
        event_reprocess(event_pk=event.pk, user=lead, reason="r", ticket="T")
    (row,) = EventReprocessing.objects.filter(event=event)
    assert row.status == ReprocessingStatus.FAILED and "database fell over" in row.error
    event.refresh_from_db()
    assert event.outcome == EventOutcome.QUARANTINED and event.outcome_detail.startswith("provider has no invoice")


@pytest.mark.race
@pytest.mark.django_db(transaction=True)
def test_two_leads_at_once_reprocess_the_event_once(sim, django_user_model):
    assert connection.vendor == "postgresql"
    leads = [django_user_model.objects.create_user(f"lead{n}", password="x", is_staff=True) for n in (1, 2)]
    _, invoice, event = failed_renewal_quarantined(sim)
    bring_back(sim, invoice)
    sim.faults.latency(f"GET /v1/invoices/{invoice['id']}", 0.5, count=4)  # both requests overlap

    def ask(user):
        try:
            return event_reprocess(event_pk=event.pk, user=user, reason="at once", ticket="RACE-1")
        except ReprocessRefused as refused:
            return refused.code

    outcomes = run_together([functools.partial(ask, user) for user in leads], timeout=60,
                            errors="return")  # any other exception stays in outcomes, reported below
    refusals = [o for o in outcomes if isinstance(o, str)]
    assert len(outcomes) == 2 and len(refusals) == 1, outcomes
    assert refusals[0] in ("REPROCESSING_IN_PROGRESS", "NOT_HELD")
    assert list(EventReprocessing.objects.values_list("status", "new_outcome")) == [("DONE", "APPLIED")]
    assert DunningCycle.objects.filter(invoice__provider_invoice_id=invoice["id"]).count() == 1


def test_the_endpoint_is_in_the_published_schema(client, db):
    paths = client.get("/api/schema/", HTTP_ACCEPT="application/json").json()["paths"]
    operation = paths["/api/v1/events/{event_id}/reprocess"]["post"]
    assert operation["operationId"] == "event_reprocess"
    assert {"200", "400", "401", "403", "404", "409", "503"} <= set(operation["responses"])
    assert any(p["name"] == "Idempotency-Key" and p["required"] for p in operation["parameters"])
