"""A wallet top-up from a Stripe payment, end to end: the real `stripe` SDK over HTTP against the
Stripe-compatible simulator on loopback; the request names the payment, Stripe's answer is the
evidence, and one payment credits once."""

from __future__ import annotations

import socket

import pytest

from agentpay.api.auth import tenant_api_key_create
from agentpay.models import LedgerAccount, Tenant, Transfer
from agentpay.services.ledger import LedgerRefusal
from agentpay.services.topups import wallet_topup_from_provider_payment

pytestmark = pytest.mark.django_db
URL = "/agentpay/v1/wallet/topups"


def stripe_payment(sim, *, card: str = "ok", amount: int = 2500) -> tuple[str, str]:
    """A customer pays (the simulator's first invoice of a subscription): (cus_…, pi_…)."""
    customer = sim.create_customer("ops@acme.test", card=card)
    subscription = sim.create_subscription(customer, "price_agentpay_topup", amount=amount)
    (invoice,) = sim.invoices(subscription)
    return customer, invoice["payment_intent"]


@pytest.fixture
def topup(client, api_key):
    def post(body: object, *, key: str | None = None, raw: bytes | None = None):
        data = raw if raw is not None else __import__("json").dumps(body)
        return client.post(URL, data=data, content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {key or api_key}")

    return post


def available(tenant: Tenant) -> int:
    return LedgerAccount.objects.get(kind="wallet", tenant=tenant).available


def link(tenant: Tenant, customer: str) -> None:
    Tenant.objects.filter(pk=tenant.pk).update(provider_customer_ref=customer)


def test_a_payment_is_fetched_from_stripe_and_credited_once(sim, funded, topup):
    customer, pi = stripe_payment(sim, amount=2500)
    link(funded, customer)
    first = topup({"payment_intent": pi, "amount": 999_999})  # only the id counts; Stripe says how much
    assert first.status_code == 201, first.content
    body = first.json()
    assert (body["payment_intent"], body["amount"], body["currency"], body["replayed"]) == (pi, 2500, "usd", False)
    assert available(funded) == 1000 + 2500 == body["available"]
    again = topup({"payment_intent": pi})
    assert again.status_code == 200 and again.json()["transfer_id"] == body["transfer_id"] and again.json()["replayed"]
    assert Transfer.objects.filter(external_ref=pi).count() == 1
    assert available(funded) == 3500
    credit = Transfer.objects.get(external_ref=pi)
    assert (credit.debit_account.kind, credit.actor) == ("topup_clearing", "provider:stripe")


def test_a_payment_that_did_not_succeed_credits_nothing(sim, funded, topup):
    customer, pi = stripe_payment(sim, card="insufficient_funds")
    link(funded, customer)
    assert sim.retrieve(pi)["status"] != "succeeded"
    response = topup({"payment_intent": pi})
    assert response.status_code == 422 and response["Content-Type"] == "application/problem+json"
    assert response.json()["type"].endswith("/payment-not-succeeded")
    assert available(funded) == 1000 and not Transfer.objects.filter(external_ref=pi).exists()


def test_a_refunded_payment_credits_nothing(sim, funded, topup):
    customer, pi = stripe_payment(sim)
    link(funded, customer)
    sim.refund(pi)
    response = topup({"payment_intent": pi})
    assert response.status_code == 422 and "refunded" in response.json()["detail"]
    assert available(funded) == 1000


def test_another_tenants_payment_is_not_found_before_and_after_it_was_credited(sim, funded, topup):
    customer, pi = stripe_payment(sim)
    _, other_key = tenant_api_key_create(tenant=Tenant.objects.create(name="other", provider_customer_ref="cus_x"))
    refused = topup({"payment_intent": pi}, key=other_key)
    assert refused.status_code == 404 and refused.json()["type"].endswith("/no-such-payment")
    link(funded, customer)
    assert topup({"payment_intent": pi}).status_code == 201
    assert topup({"payment_intent": pi}, key=other_key).status_code == 404
    assert Transfer.objects.filter(external_ref=pi).count() == 1


def test_a_payment_stripe_does_not_know_is_not_found(sim, funded, topup):
    response = topup({"payment_intent": "pi_nosuchthing"})
    assert response.status_code == 404 and response.json()["type"].endswith("/no-such-payment")


def test_stripe_unreachable_or_failing_is_a_503_and_credits_nothing(sim, funded, topup, settings):
    customer, pi = stripe_payment(sim)
    link(funded, customer)
    sim.faults.error_500("GET /v1/payment_intents/*", count=1)
    failing = topup({"payment_intent": pi})
    assert failing.status_code == 503 and failing["Retry-After"]
    assert failing.json()["type"].endswith("/provider-unavailable")
    base = settings.STRIPE_API_BASE
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        settings.STRIPE_API_BASE = f"http://127.0.0.1:{s.getsockname()[1]}"
    unreachable = topup({"payment_intent": pi})
    assert unreachable.status_code == 503 and "nothing was credited" in unreachable.json()["detail"]
    assert available(funded) == 1000 and not Transfer.objects.filter(external_ref=pi).exists()
    settings.STRIPE_API_BASE = base
    assert topup({"payment_intent": pi}).status_code == 201  # asked again later, it credits


@pytest.mark.parametrize("raw", [b"not json", b"[]", b'{"payment_intent": 5}', b'{"payment_intent": "ch_1"}',
                                 b'{"payment_intent": "pi_\\u0000"}', b"{}"])
def test_bad_input_is_a_400(funded, topup, raw):
    response = topup(None, raw=raw)
    assert response.status_code == 400 and response["Content-Type"] == "application/problem+json"


def test_no_api_key_is_a_401(client, funded):
    response = client.post(URL, data=b'{"payment_intent": "pi_1"}', content_type="application/json")
    assert response.status_code == 401


def test_metadata_names_the_tenant_and_overrules_the_customer(funded, lead):
    other = Tenant.objects.create(name="other", provider_customer_ref="cus_other")
    Tenant.objects.filter(pk=funded.pk).update(provider_customer_ref="cus_shared")
    funded.refresh_from_db()
    payment = {"id": "pi_meta1", "object": "payment_intent", "status": "succeeded", "amount_received": 700,
               "currency": "usd", "customer": "cus_shared", "metadata": {"agentpay_tenant": other.tenant_id}}
    with pytest.raises(LedgerRefusal, match="PAYMENT_NOT_FOR_TENANT"):
        wallet_topup_from_provider_payment(tenant=funded, payment=payment)
    payment["metadata"] = {"agentpay_tenant": funded.tenant_id}
    assert wallet_topup_from_provider_payment(tenant=funded, payment=payment).transfer.amount == 700
    with pytest.raises(LedgerRefusal, match="CURRENCY_MISMATCH"):
        wallet_topup_from_provider_payment(tenant=funded, payment={**payment, "id": "pi_meta2", "currency": "eur"})
