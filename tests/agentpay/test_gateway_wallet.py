"""The wallet rail end to end against a real upstream on loopback (seed 004 §3.2)."""

from __future__ import annotations

import pytest

from agentpay.api.auth import tenant_api_key_create
from agentpay.models import GatewayRequest, IntentReceipt, LedgerAccount, PaymentIntent

pytestmark = pytest.mark.django_db


def wallet(tenant) -> LedgerAccount:
    return LedgerAccount.objects.get(kind="wallet", tenant=tenant, currency="usd")


def intent_of(response) -> PaymentIntent:
    return PaymentIntent.objects.get(intent_id=response["AgentPay-Intent"])


def test_2xx_captures_and_relays_the_upstream_answer(funded, routes, upstream, call):
    response = call("ok")
    assert response.status_code == 200
    assert response.json()["result"] == "delivered"
    intent = intent_of(response)
    assert (intent.state, intent.settlements.get().state, intent.fulfillment.state) == (
        "completed", "confirmed", "succeeded")
    assert response["AgentPay-Display-Status"] == "COMPLETED"
    assert upstream.calls[0]["key"] == intent.fulfillment.fulfillment_id  # Idempotency-Key: ful_…
    w = wallet(funded)
    assert (w.available, w.debits_posted, w.debits_pending) == (850, 150, 0)


def test_4xx_releases_unbilled_and_relays_the_4xx(funded, routes, call):
    response = call("bad")
    assert response.status_code == 422
    assert response.json() == {"error": "bad input"}
    intent = intent_of(response)
    assert (intent.state, intent.settlements.get().state, intent.fulfillment.state) == ("failed", "released", "failed")
    assert response["AgentPay-Display-Status"] == "RELEASED_UNBILLED"
    assert wallet(funded).available == 1000


@pytest.mark.parametrize(("route", "status"), [("boom", 502), ("hang", 504), ("drop", 504)])
def test_5xx_timeout_or_drop_is_unknown_and_keeps_the_hold(funded, routes, call, route, status):
    response = call(route)
    assert response.status_code == status
    body = response.json()
    assert body["type"].endswith("/fulfillment-unknown")
    assert "hold" in body["detail"] and body["hold_id"].startswith("hld_")
    intent = PaymentIntent.objects.get(intent_id=body["intent_id"])
    assert (intent.state, intent.settlements.get().state, intent.fulfillment.state) == ("authorized", "held",
                                                                                         "unknown")
    assert body["display_status"] == "WALLET_HOLD_NEEDS_REVIEW"
    w = wallet(funded)
    assert (w.available, w.debits_pending, w.debits_posted) == (850, 150, 0)


def test_insufficient_balance_is_402_and_never_the_chain(funded, routes, upstream, call):
    response = call("pricey")
    assert response.status_code == 402
    assert response.json()["type"].endswith("/insufficient-balance")
    intent = intent_of(response)
    assert (intent.state, intent.settlements.get().state, intent.fulfillment.state) == ("failed", "failed",
                                                                                         "not_started")
    assert intent.settlements.get().rail == "wallet" and intent.settlements.count() == 1
    assert response.json()["display_status"] == "PAYMENT_FAILED"  # seed §5: failed + not_started
    assert upstream.calls == []
    refused = IntentReceipt.objects.get(intent=intent, accepted=False)
    assert (refused.event, refused.refusal_code) == ("hold_acquired", "INSUFFICIENT_BALANCE")


def test_a_tenant_without_a_wallet_gets_402_no_wallet(tenant, routes, call):
    response = call("ok")
    assert response.status_code == 402 and response.json()["type"].endswith("/no-wallet")
    assert intent_of(response).state == "rejected"


def test_frozen_tenant_is_policy_denied(funded, routes, upstream, call):
    funded.status = "frozen"
    funded.save(update_fields=["status"])
    response = call("ok")
    assert response.status_code == 403
    assert response.json()["type"].endswith("/policy-denied")
    assert intent_of(response).state == "rejected"
    assert upstream.calls == []


def test_a_subscription_denying_api_tokens_is_policy_denied(funded, routes, upstream, call, policy):
    from tests.support.builders import make_subscription

    subscription = make_subscription()
    subscription.entitlement_profile = "SUSPENDED"  # api_tokens: none
    subscription.save(update_fields=["entitlement_profile"])
    funded.subscription_ref = subscription.provider_subscription_id
    funded.save(update_fields=["subscription_ref"])
    response = call("ok")
    assert response.status_code == 403
    assert "SUSPENDED" in response.json()["detail"]
    assert upstream.calls == []


def test_get_routes_work_and_every_request_is_logged(funded, routes, call):
    response = call("lookup", method="get")
    assert response.status_code == 200
    logged = GatewayRequest.objects.get(request_id=response["X-Request-Id"])
    assert (logged.answer_status, logged.intent.intent_id, logged.tenant_id) == (200, response["AgentPay-Intent"],
                                                                                 funded.pk)
    assert "ak_" not in str(logged.headers.get("authorization", ""))[10:]


def test_intent_read_is_tenant_scoped(funded, routes, call, client, api_key):
    from agentpay.api.auth import tenant_api_key_create
    from agentpay.models import Tenant

    intent_id = call("ok")["AgentPay-Intent"]
    mine = client.get(f"/agentpay/v1/intents/{intent_id}", HTTP_AUTHORIZATION=f"Bearer {api_key}")
    assert mine.status_code == 200 and mine.json()["display_status"] == "COMPLETED"
    _, other_key = tenant_api_key_create(tenant=Tenant.objects.create(name="other"))
    theirs = client.get(f"/agentpay/v1/intents/{intent_id}", HTTP_AUTHORIZATION=f"Bearer {other_key}")
    assert theirs.status_code == 404
    assert client.get(f"/agentpay/v1/intents/{intent_id}").status_code == 401


def test_a_tenant_set_up_by_the_service_has_an_empty_wallet(db, routes, upstream, client):
    from agentpay.services.tenants import tenant_create

    tenant = tenant_create(name="Fresh agents")
    assert LedgerAccount.objects.get(kind="wallet", tenant=tenant).available == 0
    raw = tenant_api_key_create(tenant=tenant)[1]
    response = client.post("/agentpay/v1/routes/ok/run", data=b"{}", content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {raw}", HTTP_IDEMPOTENCY_KEY="first")
    assert response.status_code == 402 and response.json()["type"].endswith("/insufficient-balance")
    assert upstream.calls == []
