"""The world of the `agentpay_chain` bench phase (bench/agentpay_chain_bench.py): anvil with
1-second blocks and the token (the tests' own fixture code, tests/support/chain.py), the network,
an on-chain-only route and its tenant, and intents authorized the gateway's way."""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

RESOURCE = "http://127.0.0.1/agentpay/v1/routes/{slug}/run"


# ---- the world: anvil, the token, a network, a route, a tenant ------------------------------------

def start_chain() -> tuple[Any, Any]:
    """anvil with 1-second blocks, the committed token deployed and the payers minted (the tests'
    own fixture code, tests/support/chain.py). The bench needs anvil itself (interval mining,
    anvil_dropTransaction): no eth-tester fallback here."""
    from django.conf import settings

    from tests.support.chain import Chain
    from tests.support.chain_node import find_anvil, fund_and_deploy, start_anvil

    anvil, why = find_anvil()
    if anvil is None:
        raise RuntimeError(f"the agentpay_chain phase needs anvil: {why}")
    node = start_anvil(anvil, ("--block-time", "1"))
    try:
        fund_and_deploy(node)
    except BaseException:
        node.stop()
        raise
    chain = Chain(node=node, settings=settings)
    settings.AGENTPAY_CHAIN_KEYS = chain.keys  # this process signs the settlements (figures 2 and 3)
    return node, chain


def seed(chain: Any) -> dict[str, Any]:
    from agentpay.api.auth import tenant_api_key_create
    from agentpay.models import PricedRoute
    from agentpay.services.tenants import tenant_create

    network = chain.make_network(rpc_timeout_seconds=2.0)
    tenant = tenant_create(name="bench chain tenant")
    # The upstream is never called: figure 1 is unpaid, figures 2 and 3 stop at the settlement.
    route = PricedRoute.objects.create(
        slug="bench-chain", name="bench chain", upstream_base_url="http://127.0.0.1:9", upstream_path="/call",
        method="POST", price_minor=1, currency=network.currency, rails_allowed=["onchain"], network=network,
        connect_timeout_seconds=1.0, read_timeout_seconds=2.0, status_query_url="http://127.0.0.1:9/status")
    raw_key = tenant_api_key_create(tenant=tenant, label="bench chain")[1]
    return {"network": network, "tenant": tenant, "route": route, "api_key": raw_key}


def authorized_intent(route: Any, tenant: Any, buyer: Any) -> str:
    """An on-chain intent taken to `authorized` the gateway's way: opened, challenged, and its
    PAYMENT-SIGNATURE (Buyer.sign over the challenge's terms, validBefore = the challenge's expiry)
    verified by onchain_present, which reads authorizationState on chain and accepts
    payload_verified."""
    from agentpay.bridge import ApiAccess, trusted_now
    from agentpay.models import PaymentChallenge
    from agentpay.services.intents import intent_open, request_digest
    from agentpay.services.onchain_authorize import AUTHORIZED, onchain_challenge, onchain_present
    from agentpay.services.results import Cause

    body = b'{"q": 1}'
    request_id = uuid.uuid4()
    digest = request_digest(method="POST", route_slug=route.slug, path="run", query="",
                            content_type="application/json", body=body)
    intent = intent_open(tenant=tenant, route=route, rail="onchain", idempotency_key=f"bench-{uuid.uuid4().hex}",
                         digest=digest, forward_path="run", forward_query="", content_type="application/json",
                         body=body, request_id=request_id, now=trusted_now()).intent
    cause, access, resource = Cause.request(request_id, tenant.tenant_id), ApiAccess(True), RESOURCE.format(
        slug=route.slug)
    challenged = onchain_challenge(intent=intent, cause=cause, access=access, resource=resource)
    if not challenged.accepted or challenged.lines.intent != "challenged":
        raise RuntimeError(f"challenge refused: {challenged.refusal_code} {challenged.detail}")
    challenge = PaymentChallenge.objects.get(intent=intent)
    required = base64.b64encode(json.dumps(challenge.requirement).encode()).decode()
    header = buyer.sign(required, valid_before=str(int(challenge.expires_at.timestamp())))
    presented = onchain_present(intent=intent, header=header, cause=cause, access=access, resource=resource)
    if presented.status != AUTHORIZED:
        raise RuntimeError(f"payment not authorized: {presented.status} {presented.reason} {presented.detail}")
    return intent.intent_id


def buyers_of(chain: Any) -> list[Any]:
    from eth_account import Account

    from tests.agentpay_x402.buyer import Buyer

    return [Buyer(Account.from_key(p.key)) for p in chain.payers]
