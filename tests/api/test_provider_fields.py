"""Issue 20: reads state the provider of each subscription ({name, label, account}); every field
that was there stays as it was; the policy list filters by provider, an unknown one is a 400."""

from __future__ import annotations

from pathlib import Path

import pytest

from dunning.policy.publishing import policy_publish
from tests.support.builders import make_subscription

ENTITLEMENT = "/api/v1/subscriptions/{}/entitlement"
DETAIL = "/api/v1/subscriptions/{}"
ENTITLEMENT_FIELDS = {"subscription", "provider_subscription_id", "provider", "generation", "profile",
                      "capabilities", "reason", "issued_at"}


@pytest.fixture
def alipay_subscription(policy):
    policy_publish(text=Path("dunning/policy/shipped/alipay-monthly.yaml").read_text())
    return make_subscription(price="alipay_monthly", provider="alipay", provider_account="2021000000000001",
                             provider_subscription_id="20215603000000000001")


def test_the_entitlement_names_the_provider(token_client, subscription, alipay_subscription):
    client = token_client()
    stripe = client.get(ENTITLEMENT.format(subscription.pk)).json()
    assert set(stripe) == ENTITLEMENT_FIELDS
    assert stripe["provider"] == {"name": "stripe", "label": "Stripe", "account": "acct_test"}
    alipay = client.get(ENTITLEMENT.format("20215603000000000001")).json()
    assert alipay["subscription"] == alipay_subscription.pk
    assert alipay["provider_subscription_id"] == "20215603000000000001"
    assert alipay["provider"] == {"name": "alipay", "label": "Alipay", "account": "2021000000000001"}


def test_the_subscription_read_keeps_its_fields_and_adds_the_label(lead_client, alipay_subscription):
    body = lead_client.get(DETAIL.format(alipay_subscription.pk)).json()
    assert (body["provider"], body["provider_label"], body["provider_account"]) == (
        "alipay", "Alipay", "2021000000000001")
    assert body["provider_subscription_id"] == "20215603000000000001"
    assert body["policy"] == "alipay-monthly@1"
    assert {"outstanding_cycle_root", "entitlement_profile", "blocking_cycles", "verdict", "contract"} <= set(body)


def test_policies_filter_by_provider(lead_client, alipay_subscription):
    everything = lead_client.get("/api/v1/policies").json()["results"]
    assert {p["provider"]["name"] for p in everything} == {"stripe", "alipay"}
    alipay = lead_client.get("/api/v1/policies?provider=alipay").json()["results"]
    assert [p["identity"] for p in alipay] == ["alipay-monthly@1"]
    assert alipay[0]["provider"] == {"name": "alipay", "label": "Alipay", "account": "2021000000000001"}
    stripe = lead_client.get("/api/v1/policies?provider=stripe").json()["results"]
    assert stripe and all(p["provider"]["label"] == "Stripe" for p in stripe)


@pytest.mark.parametrize("value", ["paypal", "", "ALIPAY", "stripe\x00"])
def test_an_unknown_provider_is_a_400_problem(lead_client, policy, value):
    response = lead_client.get("/api/v1/policies", {"provider": value})
    assert response.status_code == 400
    assert response["Content-Type"].startswith("application/problem+json")
    problem = response.json()
    if "\x00" in value:  # refused before the view, like every NUL in a request
        assert problem["type"].endswith("/nul-character")
        return
    assert problem["type"].endswith("/validation-error")
    assert "provider" in str(problem) and "stripe, alipay" in str(problem)


def test_the_schema_states_the_provider(client, db):
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    components = schema["components"]["schemas"]
    assert set(components["Provider"]["required"]) == {"name", "label", "account"}
    assert "provider" in components["Entitlement"]["properties"]
    assert "provider_label" in components["Subscription"]["properties"]
    params = schema["paths"]["/api/v1/policies"]["get"]["parameters"]
    assert any(p["name"] == "provider" and p["schema"]["enum"] == ["alipay", "stripe"] for p in params), params
