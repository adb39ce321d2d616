"""Auth and scopes: 401 without credentials, 403 without permission, 404 outside a token's
restriction; service tokens never write; support agents cannot publish policies."""

from __future__ import annotations

import hashlib
import io
import json

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from entitlements.models import ServiceToken
from tests.support.actors import bearer_client, session_client
from tests.support.builders import make_subscription, policy_document

ENTITLEMENT = "/api/v1/subscriptions/{}/entitlement"


def _problem(response, status: int, slug: str) -> dict:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["type"] == f"https://dunning.invalid/problems/{slug}"
    assert body["status"] == status and body["title"]
    return body


def test_unauthenticated_is_401_with_www_authenticate(subscription):
    response = APIClient().get(ENTITLEMENT.format(subscription.pk))
    _problem(response, 401, "not-authenticated")
    assert response["WWW-Authenticate"] == 'Bearer realm="api"'


def test_a_wrong_or_revoked_token_is_401(token_client, subscription):
    bad = bearer_client("dsvc_not-a-token")
    _problem(bad.get(ENTITLEMENT.format(subscription.pk)), 401, "authentication-failed")
    client = token_client()
    ServiceToken.objects.update(revoked_at="2026-01-01T00:00:00Z")
    _problem(client.get(ENTITLEMENT.format(subscription.pk)), 401, "authentication-failed")


def test_an_entitlements_token_cannot_read_billing_state(token_client, grace_cycle):
    client = token_client()
    _problem(client.get(f"/api/v1/subscriptions/{grace_cycle.subscription_id}"), 403, "forbidden")
    _problem(client.get(f"/api/v1/cycles/{grace_cycle.cycle_id}"), 403, "forbidden")


@pytest.mark.parametrize("path, body", [
    ("/api/v1/cycles/{cycle}/exception", {"expires_at": "2099-01-01T00:00:00Z", "reason": "r", "ticket": "T-1"}),
    ("/api/v1/cycles/{cycle}/retry", {"reason": "r", "ticket": "T-1"}),
    ("/api/v1/policies", {"text": "{}"}),
])
def test_a_service_token_cannot_write_even_with_every_scope(token_client, grace_cycle, path, body):
    client = token_client(scopes=("entitlements:read", "billing:read"))
    response = client.post(path.format(cycle=grace_cycle.cycle_id), body, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    _problem(response, 403, "forbidden")


def test_a_support_agent_cannot_publish_policies(agent_client, policy):
    text = json.dumps(policy_document(policy="agent-made@1"))
    response = agent_client.post("/api/v1/policies", {"text": text}, format="json", HTTP_IDEMPOTENCY_KEY="p1")
    _problem(response, 403, "forbidden")
    assert agent_client.get("/api/v1/policies").status_code == 200  # but may read them


def test_staff_without_a_role_and_customers_are_forbidden(roleless_staff, customer_user, subscription):
    for user in (roleless_staff, customer_user):
        _problem(session_client(user).get(ENTITLEMENT.format(subscription.pk)), 403, "forbidden")


def test_a_token_restricted_to_one_account_gets_404_for_another_accounts_subscription(token_client, subscription):
    other = make_subscription()
    type(other).objects.filter(pk=other.pk).update(provider_account="acct_other")
    client = token_client(provider_account="acct_test", scopes=("entitlements:read", "billing:read"))
    assert client.get(ENTITLEMENT.format(subscription.pk)).status_code == 200
    _problem(client.get(ENTITLEMENT.format(other.pk)), 404, "not-found")
    _problem(client.get(ENTITLEMENT.format(other.provider_subscription_id)), 404, "not-found")
    _problem(client.get(f"/api/v1/subscriptions/{other.pk}"), 404, "not-found")


def test_a_token_restricted_to_a_cohort_gets_404_outside_it(token_client, subscription):
    other = make_subscription()
    type(other).objects.filter(pk=other.pk).update(cohort="beta")
    client = token_client(cohort="beta")
    assert client.get(ENTITLEMENT.format(other.pk)).status_code == 200
    _problem(client.get(ENTITLEMENT.format(subscription.pk)), 404, "not-found")


def test_session_writes_need_the_csrf_token(agent, grace_cycle):
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(agent)
    response = client.post(f"/api/v1/cycles/{grace_cycle.pk}/retry", {"reason": "r", "ticket": "T"}, format="json",
                           HTTP_IDEMPOTENCY_KEY="csrf-1")
    body = _problem(response, 403, "forbidden")
    assert "CSRF" in body["detail"]


def test_throttling_answers_429_with_retry_after(settings, token_client, subscription):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK,
                               "DEFAULT_THROTTLE_RATES": {**settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"],
                                                          "entitlement_read": "2/min"}}
    client = token_client()
    assert [client.get(ENTITLEMENT.format(subscription.pk)).status_code for _ in range(2)] == [200, 200]
    response = client.get(ENTITLEMENT.format(subscription.pk))
    _problem(response, 429, "rate-limited")
    assert int(response["Retry-After"]) > 0
    assert token_client().get(ENTITLEMENT.format(subscription.pk)).status_code == 200  # per principal


def test_create_service_token_prints_the_token_once_and_stores_only_its_digest(db):
    out, err = io.StringIO(), io.StringIO()
    call_command("create_service_token", "billing-runtime", "--scope", "entitlements:read",
                 "--provider-account", "acct_test", stdout=out, stderr=err)
    raw = out.getvalue().strip()
    token = ServiceToken.objects.get(name="billing-runtime")
    assert raw.startswith("dsvc_") and token.token_hash == hashlib.sha256(raw.encode()).hexdigest()
    assert token.prefix == raw[:12]
    assert token.scopes == ["entitlements:read"] and token.provider_account == "acct_test"
    assert "not shown again" in err.getvalue()


def test_an_unexpected_error_is_a_500_problem_and_releases_the_idempotency_key(agent_client, grace_cycle,
                                                                               monkeypatch):
    from entitlements.api import views_write
    from entitlements.models import IdempotencyRecord

    def broken(**kwargs):
        raise RuntimeError("provider adapter exploded")

    monkeypatch.setattr(views_write, "cycle_retry_now", broken)
    response = agent_client.post(f"/api/v1/cycles/{grace_cycle.pk}/retry", {"reason": "r", "ticket": "T"},
                                 format="json", HTTP_IDEMPOTENCY_KEY="boom")
    body = _problem(response, 500, "internal-error")
    assert "exploded" not in body["detail"]
    assert not IdempotencyRecord.objects.filter(key="boom").exists()
