"""Staff endpoints: subscription, cycle, transitions, policies, exception, retry."""

from __future__ import annotations

import json
from datetime import timedelta

from dunning.actions.retry_now import REFUSAL_TEXT
from dunning.clock import trusted_now
from dunning.models import DunningPolicy, TransitionReceipt
from tests.support.builders import accept, policy_document, reload


def test_subscription_shows_root_profile_generation_blocking_cycles_and_verdict(agent_client, grace_cycle):
    sub = grace_cycle.subscription
    for ref in (sub.pk, sub.provider_subscription_id):
        body = agent_client.get(f"/api/v1/subscriptions/{ref}").json()
        assert body["outstanding_cycle_root"] == reload(grace_cycle).subscription.outstanding_cycle_root
        assert (body["entitlement_profile"], body["entitlement_generation"]) == ("READ_EXPORT_NO_NEW_JOBS", 2)
        assert [c["cycle_id"] for c in body["blocking_cycles"]] == [str(grace_cycle.cycle_id)]
        assert body["blocking_cycles"][0]["state"] == "GRACE_ACTIVE"
        assert body["verdict"]["status"] in {"HOLD", "RECOVERY_REVIEW_READY"}


def test_a_billing_token_reads_the_subscription(token_client, grace_cycle):
    client = token_client(scopes=("billing:read",))
    assert client.get(f"/api/v1/subscriptions/{grace_cycle.subscription_id}").status_code == 200
    assert client.get(f"/api/v1/subscriptions/{grace_cycle.subscription_id}/entitlement").status_code == 403


def test_cycle_by_uuid_or_pk(agent_client, grace_cycle):
    by_uuid = agent_client.get(f"/api/v1/cycles/{grace_cycle.cycle_id}").json()
    by_pk = agent_client.get(f"/api/v1/cycles/{grace_cycle.pk}").json()
    assert by_uuid == by_pk
    assert by_uuid["state"] == "GRACE_ACTIVE" and by_uuid["invoice_status"] == "open"
    assert agent_client.get("/api/v1/cycles/not-a-uuid").status_code == 404


def test_transitions_list_accepted_and_rejected_paginated(agent_client, grace_cycle):
    refused = accept(grace_cycle, "expire_grace")  # grace has not run out: a rejection receipt
    assert not refused
    response = agent_client.get(f"/api/v1/cycles/{grace_cycle.cycle_id}/transitions?page_size=2")
    assert response.status_code == 200
    page = response.json()
    assert [(r["edge"], r["accepted"]) for r in page["results"]] == [("expire_grace", False), ("start_grace", True)]
    assert page["results"][0]["rejection_reason"]
    assert page["next"]
    rest = agent_client.get(page["next"]).json()["results"]
    total = TransitionReceipt.objects.filter(cycle=grace_cycle).count()
    assert len(page["results"]) + len(rest) == total
    assert agent_client.get(f"/api/v1/cycles/{grace_cycle.cycle_id}/transitions?page_size=100000").status_code == 200


def test_policies_list_and_a_billing_lead_publishes(lead_client, policy):
    listed = lead_client.get("/api/v1/policies").json()["results"]
    assert [p["identity"] for p in listed] == [policy.identity]
    text = json.dumps(policy_document(policy="test-monthly@2"))
    response = lead_client.post("/api/v1/policies", {"text": text}, format="json", HTTP_IDEMPOTENCY_KEY="pub-1")
    assert response.status_code == 201, response.content
    assert response.json()["created"] is True and response.json()["policy"]["identity"] == "test-monthly@2"
    assert DunningPolicy.objects.get(identity="test-monthly@2").published_by.username == "lead"
    again = lead_client.post("/api/v1/policies", {"text": text}, format="json", HTTP_IDEMPOTENCY_KEY="pub-2")
    assert again.status_code == 200 and again.json()["created"] is False


def test_publishing_an_invalid_or_conflicting_policy_is_a_problem(lead_client, policy):
    bad = lead_client.post("/api/v1/policies", {"text": "schema: nope\n"}, format="json",
                           HTTP_IDEMPOTENCY_KEY="bad-1")
    assert bad.status_code == 422 and bad["Content-Type"] == "application/problem+json"
    assert bad.json()["type"].endswith("/policy-invalid") and bad.json()["errors"]
    changed = json.dumps(policy_document(maxAttempts=2))  # same identity test-monthly@1, other content
    conflict = lead_client.post("/api/v1/policies", {"text": changed}, format="json", HTTP_IDEMPOTENCY_KEY="c-1")
    assert conflict.status_code == 409 and conflict.json()["type"].endswith("/policy-conflict")


def test_validation_errors_list_field_faults(agent_client, grace_cycle):
    response = agent_client.post(f"/api/v1/cycles/{grace_cycle.pk}/exception",
                                 {"expires_at": "soon", "profile": "GOLD", "colour": "red"}, format="json",
                                 HTTP_IDEMPOTENCY_KEY="v-1")
    assert response.status_code == 400 and response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["type"].endswith("/validation-error")
    assert {e["field"] for e in body["errors"]} == {"colour"}
    response = agent_client.post(f"/api/v1/cycles/{grace_cycle.pk}/exception",
                                 {"expires_at": "soon", "profile": "GOLD"}, format="json",
                                 HTTP_IDEMPOTENCY_KEY="v-1")
    assert {e["field"] for e in response.json()["errors"]} == {"expires_at", "profile", "reason", "ticket"}


def test_an_agent_grants_an_exception_through_acceptance(agent_client, agent, grace_cycle):
    expires = trusted_now() + timedelta(days=3)
    response = agent_client.post(f"/api/v1/cycles/{grace_cycle.cycle_id}/exception",
                                 {"expires_at": expires.isoformat(), "reason": "customer in hospital",
                                  "ticket": "SUP-42", "profile": "LIMITED"},
                                 format="json", HTTP_IDEMPOTENCY_KEY="exc-1")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["accepted"] and (body["from_state"], body["to_state"]) == ("GRACE_ACTIVE", "EXCEPTION_ACTIVE")
    cycle = reload(grace_cycle)
    assert (cycle.exception_owner, cycle.exception_ticket, cycle.exception_profile) == ("agent", "SUP-42", "LIMITED")
    receipt = TransitionReceipt.objects.get(pk=body["receipt_id"])
    assert (receipt.actor_user, receipt.reason, receipt.ticket) == (agent, "customer in hospital", "SUP-42")


def test_an_exception_refused_by_the_policy_is_a_422_with_the_refusal_code(agent_client, grace_cycle):
    too_long = trusted_now() + timedelta(days=60)  # the policy allows 14 days
    response = agent_client.post(f"/api/v1/cycles/{grace_cycle.pk}/exception",
                                 {"expires_at": too_long.isoformat(), "reason": "r", "ticket": "T-1"},
                                 format="json", HTTP_IDEMPOTENCY_KEY="exc-long")
    assert response.status_code == 422 and response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["code"] == "EXCEPTION_TOO_LONG" and body["type"].endswith("/exception-too-long")
    assert reload(grace_cycle).state == "GRACE_ACTIVE"
    assert TransitionReceipt.objects.filter(cycle=grace_cycle, edge="grant_exception", accepted=False).exists()


def test_an_exception_on_a_cycle_in_the_wrong_state_is_a_409(agent_client, subscription):
    from tests.support.builders import open_cycle

    current = open_cycle(subscription)
    response = agent_client.post(f"/api/v1/cycles/{current.pk}/exception",
                                 {"expires_at": (trusted_now() + timedelta(days=1)).isoformat(), "reason": "r",
                                  "ticket": "T"}, format="json", HTTP_IDEMPOTENCY_KEY="exc-state")
    assert response.status_code == 409 and response.json()["code"] == "EDGE_NOT_ALLOWED"


def test_retry_refused_is_a_409_in_plain_words(agent_client, grace_cycle):
    response = agent_client.post(f"/api/v1/cycles/{grace_cycle.pk}/retry", {"reason": "asked", "ticket": "T-9"},
                                 format="json", HTTP_IDEMPOTENCY_KEY="retry-1")
    assert response.status_code == 409 and response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["code"] == "RETRY_AUTHORITY_IS_PROVIDER"
    assert body["detail"] == REFUSAL_TEXT["RETRY_AUTHORITY_IS_PROVIDER"]


def test_retry_now_pays_through_the_local_retry_path(sim, agent_client):
    from tests.support.scenarios import cycle_of, failed_renewal

    customer, invoice_id, cycle = failed_renewal(sim, price="price_monthly_local", decline="insufficient_funds")
    sim.set_card(customer, "ok")
    response = agent_client.post(f"/api/v1/cycles/{cycle.cycle_id}/retry", {"reason": "card updated",
                                                                             "ticket": "SUP-7"},
                                 format="json", HTTP_IDEMPOTENCY_KEY="retry-paid")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "PAID"
    assert cycle_of(invoice_id).state == "RECOVERED"
    assert len(sim.successful_charges(invoice_id)) == 1
