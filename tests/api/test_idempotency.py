"""Idempotency-Key on the state-changing POSTs: replay, 422 on a different body, 409 while the
first request is in flight (also with a real second thread and connection)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from rest_framework.test import APIClient

from dunning.clock import trusted_now
from dunning.models import TransitionReceipt
from entitlements.api import views_write
from entitlements.models import IdempotencyRecord
from tests.support.builders import fail_first_payment, make_policy, make_subscription, open_cycle


def _grant(client, cycle, key, *, reason="customer in hospital", days=3):
    return client.post(f"/api/v1/cycles/{cycle.pk}/exception",
                       {"expires_at": (trusted_now() + timedelta(days=days)).replace(microsecond=0).isoformat(),
                        "reason": reason, "ticket": "SUP-1"},
                       format="json", HTTP_IDEMPOTENCY_KEY=key)


def test_the_same_key_and_body_replays_the_stored_response(agent_client, grace_cycle):
    body = {"expires_at": (trusted_now() + timedelta(days=3)).isoformat(), "reason": "r", "ticket": "T"}
    url = f"/api/v1/cycles/{grace_cycle.pk}/exception"
    first = agent_client.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY="same")
    second = agent_client.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY="same")
    assert first.status_code == second.status_code == 200
    assert second.json() == first.json()
    assert second["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first
    assert TransitionReceipt.objects.filter(cycle=grace_cycle, edge="grant_exception").count() == 1


def test_a_refusal_is_replayed_too_with_its_problem_type(agent_client, grace_cycle):
    url = f"/api/v1/cycles/{grace_cycle.pk}/retry"
    first = agent_client.post(url, {"reason": "r", "ticket": "T"}, format="json", HTTP_IDEMPOTENCY_KEY="r1")
    second = agent_client.post(url, {"reason": "r", "ticket": "T"}, format="json", HTTP_IDEMPOTENCY_KEY="r1")
    assert first.status_code == second.status_code == 409
    assert second["Content-Type"] == "application/problem+json" and second.json() == first.json()
    assert second["Idempotent-Replayed"] == "true"


def test_the_same_key_with_a_different_body_is_422(agent_client, grace_cycle):
    assert _grant(agent_client, grace_cycle, "k").status_code == 200
    response = _grant(agent_client, grace_cycle, "k", reason="something else")
    assert response.status_code == 422
    assert response.json()["type"].endswith("/idempotency-key-reused")
    assert TransitionReceipt.objects.filter(cycle=grace_cycle, edge="grant_exception").count() == 1


def test_keys_belong_to_their_principal(agent_client, lead_client, grace_cycle):
    assert _grant(agent_client, grace_cycle, "shared").status_code == 200
    other = _grant(lead_client, grace_cycle, "shared")  # runs: a new decision, refused by the state now
    assert other.status_code == 409 and other.json()["code"] == "EDGE_NOT_ALLOWED"
    assert "Idempotent-Replayed" not in other


def test_a_request_in_flight_makes_a_duplicate_409(agent_client, grace_cycle):
    assert _grant(agent_client, grace_cycle, "busy").status_code == 200
    IdempotencyRecord.objects.filter(key="busy").update(state="IN_FLIGHT", created_at=trusted_now())
    response = _grant(agent_client, grace_cycle, "busy")
    assert response.status_code == 409 and response.json()["type"].endswith("/idempotency-key-in-flight")


def test_a_claim_left_by_a_crashed_request_is_taken_over(agent_client, grace_cycle):
    assert _grant(agent_client, grace_cycle, "crashed", days=2).status_code == 200
    IdempotencyRecord.objects.filter(key="crashed").update(
        state="IN_FLIGHT", created_at=trusted_now() - timedelta(minutes=10))
    response = _grant(agent_client, grace_cycle, "crashed", days=2)
    assert response.status_code == 409 and response.json()["code"] == "EDGE_NOT_ALLOWED"  # the service ran again
    assert IdempotencyRecord.objects.get(key="crashed").state == "DONE"


def test_a_missing_key_is_a_400_and_nothing_runs(agent_client, grace_cycle):
    response = agent_client.post(f"/api/v1/cycles/{grace_cycle.pk}/retry", {"reason": "r", "ticket": "T"},
                                 format="json")
    assert response.status_code == 400 and response.json()["type"].endswith("/idempotency-key-required")
    assert not TransitionReceipt.objects.filter(cycle=grace_cycle, edge="schedule_retry").exists()


def test_invalid_input_is_not_stored_so_the_key_can_be_reused_after_fixing_it(agent_client, grace_cycle):
    url = f"/api/v1/cycles/{grace_cycle.pk}/retry"
    assert agent_client.post(url, {"reason": "r"}, format="json", HTTP_IDEMPOTENCY_KEY="fix").status_code == 400
    fixed = agent_client.post(url, {"reason": "r", "ticket": "T"}, format="json", HTTP_IDEMPOTENCY_KEY="fix")
    assert fixed.status_code == 409 and fixed.json()["code"] == "RETRY_AUTHORITY_IS_PROVIDER"


@pytest.mark.race
@pytest.mark.django_db(transaction=True)
def test_a_concurrent_duplicate_on_another_connection_gets_409_while_the_first_runs(monkeypatch, django_user_model):
    make_policy()
    cycle = open_cycle(make_subscription())
    fail_first_payment(cycle)
    boss = django_user_model.objects.create_superuser("boss", password="x")  # all permissions; no groups needed
    started, release = threading.Event(), threading.Event()
    real = views_write.cycle_retry_now

    def slow_retry(**kwargs):
        started.set()
        assert release.wait(10)
        return real(**kwargs)

    monkeypatch.setattr(views_write, "cycle_retry_now", slow_retry)
    url, body = f"/api/v1/cycles/{cycle.pk}/retry", {"reason": "r", "ticket": "T"}
    results = {}

    def first_request():
        try:
            client = APIClient()
            client.force_login(boss)
            results["first"] = client.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY="race")
        finally:
            connection.close()

    thread = threading.Thread(target=first_request)
    thread.start()
    try:
        assert started.wait(10)
        client = APIClient()
        client.force_login(boss)
        duplicate = client.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY="race")
        assert duplicate.status_code == 409
        assert duplicate.json()["type"].endswith("/idempotency-key-in-flight")
    finally:
        release.set()
        thread.join(15)
    assert results["first"].status_code == 409 and results["first"].json()["code"] == "RETRY_AUTHORITY_IS_PROVIDER"
    replay = client.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY="race")
    assert replay["Idempotent-Replayed"] == "true" and replay.json() == results["first"].json()
