"""The x402 tests' world: the AgentPay actors (tests/agentpay/conftest.py), a chain network, an
on-chain-only route and one that takes both rails, a buyer, and the token's nonce state.

Without chain's `chain` fixture these tests run against no node: the token's
authorizationState is the `nonce_state` fixture (a set of (payer, nonce) the "token" has seen
used), patched where the service reads it. The end-to-end tests use the real chain.
"""

from __future__ import annotations

import pytest

from agentpay.models import ChainNetwork, PricedRoute
from agentpay.services import onchain_authorize
from tests.agentpay.conftest import api_key, audited_ledger, call, lead, tenant, upstream  # noqa: F401
from tests.agentpay_x402.buyer import Buyer

TOKEN = "0x" + "5f" * 20
PAY_TO = "0x" + "a1" * 20
SUBMITTER = "0x" + "b2" * 20


@pytest.fixture
def network(db):
    return ChainNetwork.objects.create(
        caip2="eip155:31337", name="anvil", chain_id=31337, rpc_url="http://127.0.0.1:9/", token_address=TOKEN,
        token_name="USD Coin", token_version="2", pay_to=PAY_TO, submitter=SUBMITTER)


@pytest.fixture
def chain_routes(network, upstream):  # noqa: F811
    def make(slug: str, rails: list[str], path: str = "/ok") -> PricedRoute:
        return PricedRoute.objects.create(
            slug=slug, name=slug, upstream_base_url=upstream.base_url, upstream_path=path, method="POST",
            price_minor=150, currency="usd", rails_allowed=rails, connect_timeout_seconds=1.0,
            read_timeout_seconds=5.0, status_query_url=f"{upstream.base_url}/status", network=network)

    return {"paid": make("paid", ["onchain"]), "both": make("both", ["wallet", "onchain"])}


@pytest.fixture
def buyer():
    return Buyer()


@pytest.fixture
def nonce_state(monkeypatch):
    """The token's authorizationState as a set of used (payer, nonce); `calls` counts the reads."""

    class State:
        used: set[tuple[str, str]] = set()
        calls = 0
        down = False

    state = State()
    state.used = set()

    def authorization_state(network, payer, nonce):
        state.calls += 1
        if state.down:
            raise onchain_authorize.ChainTimeout("no answer from the node")
        return (payer.lower(), nonce.lower()) in state.used

    monkeypatch.setattr(onchain_authorize, "authorization_state", authorization_state)
    return state
