"""Worlds for the on-chain settlement tests: a network row pointing at the test chain (or at a
fault proxy in front of it), a priced on-chain route to the loopback upstream, and an intent
brought to `authorized` with a real EIP-3009 authorization signed by a payer with eth_account.

The authorization row is written here, beside the real acceptances (`challenge_issued`,
`payload_verified`): the gateway's verification (x402's part) writes it in its own acceptance;
these tests start after it, at the settlement. The payer signs with the chain fixture's
`sign_authorization` (eth_account, EIP-712 over the token's domain).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from agentpay.bridge import trusted_now
from agentpay.models import ChainAuthorization, ChainNetwork, IntentReceipt, PaymentIntent, PricedRoute, Tenant
from agentpay.services.acceptance import intent_accept
from agentpay.services.intents import intent_open, request_digest
from agentpay.services.results import Cause, Step
from agentpay.services.tenants import tenant_create


@dataclass
class World:
    chain: Any
    network: ChainNetwork
    tenant: Tenant
    route: PricedRoute

    @property
    def amount(self) -> int:
        """The route's price in the token's atomic units."""
        return self.route.price_minor * self.network.atomic_per_minor


def world(chain: Any, upstream: Any, *, path: str = "/ok", rpc_url: str | None = None, price: int = 150,
          **network: Any) -> World:
    if rpc_url is not None:
        network["rpc_url"] = rpc_url
    net = chain.make_network(**network)
    tag = uuid.uuid4().hex[:8]
    tenant = tenant_create(name=f"chain {tag}")
    route = PricedRoute.objects.create(
        slug=f"chain-{tag}", name=f"chain {tag}", upstream_base_url=upstream.base_url, upstream_path=path,
        method="POST", price_minor=price, currency=net.currency, rails_allowed=["onchain"], network=net,
        connect_timeout_seconds=1.0, read_timeout_seconds=3.0, status_query_url=f"{upstream.base_url}/status")
    return World(chain, net, tenant, route)


def authorized_intent(w: World, payer: Any, *, key: str | None = None, **auth: Any) -> PaymentIntent:
    """An on-chain intent, challenged and authorized through the acceptance service, with the
    payer's signed authorization stored as the gateway's verification stores it."""
    now, request_id = trusted_now(), uuid.uuid4()
    body = b'{"q": 1}'
    digest = request_digest(method="POST", route_slug=w.route.slug, path="", query="",
                            content_type="application/json", body=body)
    intent = intent_open(tenant=w.tenant, route=w.route, rail="onchain", idempotency_key=key or uuid.uuid4().hex,
                         digest=digest, forward_path="", forward_query="", content_type="application/json",
                         body=body, request_id=request_id, now=now).intent
    cause = Cause.request(request_id, w.tenant.tenant_id)
    assert intent_accept(intent_id=intent.intent_id, steps=[Step("intent", "challenge_issued")], cause=cause,
                         now=now).accepted
    signed = w.chain.sign_authorization(payer, value=auth.pop("value", w.amount), **auth)
    ChainAuthorization.objects.create(
        intent=intent, network=w.network, token_address=w.network.token_address, payer=signed["from"].lower(),
        pay_to=signed["to"].lower(), value=signed["value"], valid_after=signed["validAfter"],
        valid_before=signed["validBefore"], nonce=signed["nonce"].lower(), signature=signed["signature"],
        payload={"authorization": {k: str(v) for k, v in signed.items() if k != "signature"}}, received_at=now)
    outcome = intent_accept(intent_id=intent.intent_id, cause=cause, now=now,
                            steps=[Step("intent", "payload_verified", {"scheme": "exact", "eip3009": "valid"})])
    assert outcome.accepted, outcome
    intent.refresh_from_db()
    return intent


def settlement_events(intent: PaymentIntent) -> list[str]:
    return list(IntentReceipt.objects.filter(intent=intent, line="settlement", accepted=True).order_by("pk")
                .values_list("event", flat=True))


def lines(intent: PaymentIntent) -> tuple[str, str, str]:
    intent.refresh_from_db()
    return intent.state, intent.settlements.order_by("-pk").first().state, intent.fulfillment.state
