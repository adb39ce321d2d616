"""Tenant-scoped idempotency (seed 004 §2): one key is one intent, for ever."""

from __future__ import annotations

import pytest
from django.test import Client

from agentpay.models import GatewayRequest, PaymentIntent
from tests.support.threads import run_together


@pytest.mark.django_db
def test_a_replay_answers_the_composite_view_and_calls_nothing(funded, routes, upstream, call):
    first = call("ok", "key-A")
    again = call("ok", "key-A")
    assert again.status_code == 200 and again["Idempotent-Replayed"] == "true"
    assert again.json()["intent_id"] == first["AgentPay-Intent"]
    assert again.json()["display_status"] == "COMPLETED"
    assert len(upstream.calls) == 1
    assert PaymentIntent.objects.count() == 1


@pytest.mark.django_db
def test_the_same_key_with_a_different_request_is_422(funded, routes, call):
    call("ok", "key-B")
    response = call("ok", "key-B", body=b'{"q": 2}')
    assert response.status_code == 422
    assert response.json()["type"].endswith("/idempotency-key-reused")


@pytest.mark.django_db
def test_the_same_key_while_in_flight_is_409(funded, routes, call):
    from datetime import timedelta

    from agentpay.bridge import trusted_now

    call("boom", "key-C")
    PaymentIntent.objects.update(processing_until=trusted_now() + timedelta(minutes=1))  # as if still running
    response = call("boom", "key-C")
    assert response.status_code == 409
    assert response.json()["type"].endswith("/idempotency-in-flight")


@pytest.mark.django_db
def test_keys_are_tenant_scoped(funded, routes, call, client):  # noqa: ARG001
    from agentpay.api.auth import tenant_api_key_create
    from agentpay.models import Tenant

    call("ok", "shared")
    _, other_key = tenant_api_key_create(tenant=Tenant.objects.create(name="other"))
    response = client.post("/agentpay/v1/routes/ok/run", data=b'{"q": 1}', content_type="application/json",
                           HTTP_IDEMPOTENCY_KEY="shared", HTTP_AUTHORIZATION=f"Bearer {other_key}")
    assert response.status_code == 402  # its own intent (and no wallet), not the first tenant's
    assert PaymentIntent.objects.filter(idempotency_key="shared").count() == 2


@pytest.mark.race
@pytest.mark.django_db(transaction=True)
def test_64_concurrent_requests_with_one_key_make_exactly_one_intent(funded, routes, upstream, api_key):
    def one() -> int:
        return Client().post("/agentpay/v1/routes/ok/run", data=b'{"q": 1}', content_type="application/json",
                             HTTP_IDEMPOTENCY_KEY="hot-key", HTTP_AUTHORIZATION=f"Bearer {api_key}").status_code

    statuses = run_together([one] * 64, timeout=120)
    assert PaymentIntent.objects.filter(idempotency_key="hot-key").count() == 1
    assert len(upstream.calls) == 1
    assert statuses.count(200) >= 1 and set(statuses) <= {200, 409}
    assert GatewayRequest.objects.count() == 64
    intent = PaymentIntent.objects.get()
    assert intent.state == "completed"
