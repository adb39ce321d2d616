"""Worlds for the on-chain settlement tests: a network row pointing at the test chain (or at a
fault proxy in front of it), a priced on-chain route to the loopback upstream, and an intent
brought to `authorized` with a real EIP-3009 authorization signed by a payer with eth_account.

The intent is authorized through the gateway's real acceptances (x402's effects write the
challenge and the authorization); these tests start after it, at the settlement. The payer signs
with the chain fixture's `sign_authorization` (eth_account, EIP-712 over the token's domain).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from agentpay.bridge import trusted_now
from agentpay.models import ChainNetwork, IntentReceipt, PaymentChallenge, PaymentIntent, PricedRoute, Tenant
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
    """An on-chain intent brought to `authorized` by the gateway's own acceptances (x402's
    effects write the PaymentChallenge and the ChainAuthorization): challenge_issued, then
    payload_verified with the payer's PaymentPayload for exactly that challenge."""
    now, request_id = trusted_now(), uuid.uuid4()
    body = b'{"q": 1}'
    digest = request_digest(method="POST", route_slug=w.route.slug, path="", query="",
                            content_type="application/json", body=body)
    intent = intent_open(tenant=w.tenant, route=w.route, rail="onchain", idempotency_key=key or uuid.uuid4().hex,
                         digest=digest, forward_path="", forward_query="", content_type="application/json",
                         body=body, request_id=request_id, now=now).intent
    cause = Cause.request(request_id, w.tenant.tenant_id)
    issued = intent_accept(intent_id=intent.intent_id, steps=[Step("intent", "challenge_issued")], cause=cause,
                           now=now)
    assert issued.accepted, issued
    required = PaymentChallenge.objects.get(intent=intent).requirement
    # The SDK's client signs validBefore = its clock + maxTimeoutSeconds (the gateway allows that).
    auth.setdefault("valid_before", int(time.time()) + required["accepts"][0]["maxTimeoutSeconds"])
    signed = w.chain.sign_authorization(payer, value=auth.pop("value", w.amount), **auth)
    payload = {"x402Version": 2, "accepted": required["accepts"][0], "resource": required["resource"],
               "payload": {"signature": signed["signature"],
                           "authorization": {k: v for k, v in signed.items() if k != "signature"}}}
    outcome = intent_accept(intent_id=intent.intent_id, cause=cause, now=trusted_now(), steps=[
        Step("intent", "payload_verified", {"payment_payload": payload, "authorization_state": "unused"})])
    assert outcome.accepted, outcome
    intent.refresh_from_db()
    return intent


def settlement_events(intent: PaymentIntent) -> list[str]:
    return list(IntentReceipt.objects.filter(intent=intent, line="settlement", accepted=True).order_by("pk")
                .values_list("event", flat=True))


def lines(intent: PaymentIntent) -> tuple[str, str, str]:
    intent.refresh_from_db()
    return intent.state, intent.settlements.order_by("-pk").first().state, intent.fulfillment.state
