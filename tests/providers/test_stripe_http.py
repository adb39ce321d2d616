"""The SDK's HTTP client (subscriptions.providers.stripe_http): sessions that take the
environment's proxies for the API's address once, when the adapter is built, and do not read the
environment again on each request; a fetch through them still reaches the provider."""

from __future__ import annotations

import os

import pytest
import requests

from subscriptions.providers.stripe_http import stripe_http_client
from tests.providers.test_invoice_fetch import provider, sim  # noqa: F401 - the simulator fixture

API = "https://api.stripe.com"


@pytest.fixture
def no_proxy_environment(monkeypatch):
    for name in list(os.environ):
        if name.lower().endswith("_proxy"):
            monkeypatch.delenv(name)
    return monkeypatch


def _session(api_base: str = API) -> requests.Session:
    return stripe_http_client(api_base=api_base, timeout=5.0).requests.Session()


def test_the_environment_s_proxy_is_taken_when_the_client_is_built(no_proxy_environment):
    no_proxy_environment.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    session = _session()
    assert not session.trust_env and session.proxies["https"] == "http://proxy.internal:3128"
    no_proxy_environment.setenv("NO_PROXY", "api.stripe.com")
    assert "https" not in _session().proxies  # the API's host bypasses it


def test_a_request_does_not_read_the_environment_again(no_proxy_environment):
    session = _session()
    no_proxy_environment.setenv("HTTPS_PROXY", "http://proxy.internal:3128")  # set after the client was built
    settings = session.merge_environment_settings(f"{API}/v1/invoices/in_1", {}, False, True, None)
    assert "https" not in settings["proxies"]
    assert "https" in requests.Session().merge_environment_settings(f"{API}/v1/invoices/in_1", {}, False, True,
                                                                    None)["proxies"], "a default session would"


def test_a_fetch_goes_through_the_client_s_sessions(sim, monkeypatch):  # noqa: F811
    made: list[requests.Session] = []
    adapter = provider(sim)
    lib = adapter._client._requestor._client.requests
    make = type(lib).Session
    monkeypatch.setattr(type(lib), "Session", lambda self: made.append(make(self)) or made[-1])
    customer = sim.create_customer("ada@example.com", card="stolen_card")
    invoice_id = sim.create_renewal_invoice(sim.create_subscription(customer, "price_monthly_pro", amount=2500))
    assert adapter.fetch_invoice(invoice_id).id == invoice_id
    assert len(made) == 1 and not made[0].trust_env
