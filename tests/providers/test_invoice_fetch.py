"""The invoice fetch every paid event makes (issue 21): the SDK's GET through its requestor, the
invoice exactly as the provider's JSON says, the SDK's errors in the product's words, and no
StripeObject tree built on the way (it was thrown away for the JSON, about 2 ms of CPU a fetch)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import stripe._api_requestor

from subscriptions.providers.base import ProviderNotFound
from subscriptions.providers.stripe_adapter import StripeProvider
from tests.verification.fake_stripe import StripeSimulator


@pytest.fixture
def sim() -> Iterator[StripeSimulator]:
    simulator = StripeSimulator()
    simulator.start()
    yield simulator
    simulator.stop()


def provider(sim: StripeSimulator) -> StripeProvider:
    return StripeProvider(api_key="sk_test_local", api_base=sim.base_url, webhook_secrets=["whsec_local"],
                          account="acct_demo", timeout=5.0)


def test_the_fetched_invoice_is_the_providers_json_with_its_payments_and_no_sdk_objects(sim, monkeypatch):
    customer = sim.create_customer("ada@example.com", card="stolen_card")
    invoice_id = sim.create_renewal_invoice(sim.create_subscription(customer, "price_monthly_pro", amount=2500))
    sim.provider_attempt(invoice_id)

    def no_objects(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("the fetch built the SDK's StripeObject tree")

    monkeypatch.setattr(stripe._api_requestor, "_convert_to_stripe_object", no_objects)
    fetched = provider(sim).fetch_invoice(invoice_id)
    assert (fetched.id, fetched.status, fetched.amount_due, fetched.attempt_count) == (invoice_id, "open", 2500, 1)
    assert type(fetched.raw) is dict and fetched.raw["id"] == invoice_id
    assert fetched.raw["payments"]["data"], "expand[]=payments was not sent"
    assert fetched.payment_refs


def test_an_invoice_the_provider_does_not_have_is_not_found(sim):
    with pytest.raises(ProviderNotFound):
        provider(sim).fetch_invoice("in_does_not_exist")
