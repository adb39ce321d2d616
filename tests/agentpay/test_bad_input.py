"""Bad input gets a clear 4xx problem document, never a 500, and every request is recorded."""

from __future__ import annotations

import pytest

from agentpay.models import GatewayRequest, PaymentIntent

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(("kwargs", "status", "slug"), [
    ({"body": b'{"q": ', "key": "j"}, 400, "malformed-json"),
    ({"body": b"[" * 50_000 + b"]" * 50_000, "key": "deep"}, 400, "malformed-json"),
    ({"key": None}, 400, "idempotency-key-required"),
    ({"key": "x" * 256}, 400, "idempotency-key-too-long"),
    ({"key": "has space"}, 400, "idempotency-key-invalid"),
    ({"key": "nul\x00key"}, 400, "idempotency-key-invalid"),
    ({"key": "a1", "agentpay_amount": "-5"}, 400, "invalid-amount"),
    ({"key": "a2", "agentpay_amount": "1.5"}, 400, "invalid-amount"),
    ({"key": "a3", "agentpay_amount": "149"}, 422, "amount-mismatch"),
    ({"key": "c1", "agentpay_currency": "eur"}, 422, "currency-mismatch"),
    ({"key": "r1", "agentpay_rail": "onchain"}, 422, "rail-not-allowed"),
    ({"key": "m1", "method": "put"}, 405, "method-not-allowed"),
    ({"key": "u1", "authorization": "Bearer ak_wrong"}, 401, "authentication-failed"),
])
def test_bad_calls_are_problem_documents_and_logged(funded, routes, call, kwargs, status, slug):
    route = kwargs.pop("route", "ok")
    response = call(route, **kwargs)
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["type"].endswith("/" + slug)
    logged = GatewayRequest.objects.get(request_id=response["X-Request-Id"])
    assert logged.answer_status == status
    assert PaymentIntent.objects.count() == 0


def test_unknown_route_is_404(funded, routes, call):
    response = call("nope")
    assert response.status_code == 404 and response.json()["type"].endswith("/unknown-route")


def test_a_nul_in_the_path_is_refused_and_still_recorded(funded, routes, client, api_key):
    response = client.post("/agentpay/v1/routes/ok/a%00b", data=b"{}", content_type="application/json",
                           HTTP_IDEMPOTENCY_KEY="n1", HTTP_AUTHORIZATION=f"Bearer {api_key}")
    assert response.status_code == 400
    assert GatewayRequest.objects.get(request_id=response["X-Request-Id"]).answer_status == 400


def test_a_binary_body_with_nuls_is_forwarded_as_is(funded, routes, upstream, call):
    response = call("ok", "bin", body=b"\x00\x01\x02", content_type="application/octet-stream")
    assert response.status_code == 200
    assert upstream.calls[0]["body"] == b"\x00\x01\x02"


def test_the_agentpay_schema_is_published_apart(client, db):
    mine = client.get("/agentpay/v1/schema/", HTTP_ACCEPT="application/json").json()
    assert set(mine["paths"]) == {"/agentpay/v1/routes/{route}/{subpath}", "/agentpay/v1/routes/{route}",
                                  "/agentpay/v1/intents/{intent_id}", "/agentpay/v1/wallet/topups"}
    topup = mine["paths"]["/agentpay/v1/wallet/topups"]["post"]
    assert {"201", "200", "400", "404", "422", "503"} <= set(topup["responses"])
    billing = client.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    assert not [p for p in billing["paths"] if p.startswith("/agentpay/")]
