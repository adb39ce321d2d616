"""The x402 steps' effects (issue 18; x402's part of `effects.EFFECTS`): the challenge we send
and the authorization the payer signed are written inside the same acceptance that moves the
intent, so a challenged intent always has its PaymentChallenge and an authorized one its
ChainAuthorization (seed §4.1 guards `onchain_challenge_persisted`, `onchain_signature_valid`).

`payload_verified` re-checks the payment against the stored challenge at the acceptance's own
`now` (pure: the window, the amount, the signature). The token's `authorizationState` is a
network call and cannot run here: the caller reads it first and says so in the step's data
(`authorization_state: "unused"`). The unique (network, token, payer, nonce) is the last word on
"one authorization pays one intent": its violation is refused as NONCE_ALREADY_USED.

Step data:
- challenge_issued: optional `resource` (the URL the 402 names).
- payload_verified (on-chain): `payment_payload` (the decoded PAYMENT-SIGNATURE document) and
  `authorization_state: "unused"`.
- payload_invalid: `reason` (snake_case, e.g. invalid_signature) and optional `detail`.

`ctx` is `effects.EffectContext` (not imported: effects imports this module).
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from eth_utils import to_checksum_address
from pydantic import ValidationError
from x402.schemas import PaymentPayload

from agentpay.models import ChainAuthorization, ChainNetwork, PaymentChallenge, PaymentIntent, PricedRoute
from agentpay.services.results import Refusal, Step
from agentpay.states import INTENT, ONCHAIN
from agentpay.x402.headers import challenge_json, encode_json
from agentpay.x402.verify import PaymentInvalid, Terms, verify_payment


def challenge_ttl() -> timedelta:
    return timedelta(seconds=settings.AGENTPAY_CHALLENGE_TTL_SECONDS)


def network_refusal(intent: PaymentIntent, network: ChainNetwork | None) -> str:
    """Why this intent's route cannot take the chain ('' when it can)."""
    if network is None:
        return f"route {intent.route.slug} has no chain network"
    if not network.active:
        return f"the network {network.caip2} is not active"
    if network.currency != intent.currency:
        return f"the route is priced in {intent.currency}; the token on {network.caip2} is {network.currency}"
    return ""


def challenge_amount(intent: PaymentIntent, network: ChainNetwork) -> int:
    """The price in the token's atomic units (minor units × atomic_per_minor)."""
    return int(intent.amount) * int(network.atomic_per_minor)


def terms_of(challenge: PaymentChallenge) -> Terms:
    network = challenge.network
    return Terms(caip2=network.caip2, chain_id=int(network.chain_id), asset=challenge.asset, pay_to=challenge.pay_to,
                 amount=int(challenge.amount), token_name=network.token_name, token_version=network.token_version,
                 expires_at=int(challenge.expires_at.timestamp()),
                 valid_before_slack=settings.AGENTPAY_X402_VALID_BEFORE_SLACK_SECONDS)


@lru_cache(maxsize=64)
def _checksummed(address: str) -> str:
    """The EIP-55 form of a network's token or payee address: a keccak each time, on every 402;
    a process sees a handful of networks, whose addresses never change form."""
    return to_checksum_address(address)


def _requirement(intent: PaymentIntent, network: ChainNetwork, resource: str) -> tuple[dict[str, Any], str]:
    """(the challenge's document, as stored; its PAYMENT-REQUIRED header value, the same JSON)."""
    text = challenge_json(
        resource_url=resource, description=f"{intent.route.name}: {intent.amount} {intent.currency} per call",
        caip2=network.caip2, asset=_checksummed(network.token_address), pay_to=_checksummed(network.pay_to),
        amount=challenge_amount(intent, network), token_name=network.token_name, token_version=network.token_version,
        max_timeout_seconds=settings.AGENTPAY_CHALLENGE_TTL_SECONDS)
    return json.loads(text), encode_json(text)


def challenge_issued(ctx: Any, step: Step) -> None:
    ctx.intent_fields["challenged_at"] = ctx.now
    intent = ctx.intent
    if intent.rail != ONCHAIN:
        return
    if PaymentIntent.route.is_cached(intent) and PricedRoute.network.is_cached(intent.route):
        network = intent.route.network  # the request's own read of its route (intent_open)
    else:
        route = PricedRoute.objects.select_related("network").get(pk=intent.route_id)  # one read, not two
        intent.route, network = route, route.network
    why = network_refusal(intent, network)
    if why:
        raise Refusal("NO_CHAIN_NETWORK", why, step)
    resource = str(step.data.get("resource") or f"/agentpay/v1/routes/{intent.route.slug}/{intent.forward_path}")
    requirement, header = _requirement(intent, network, resource[:2000])
    challenge = PaymentChallenge(
        intent=intent, network=network, pay_to=network.pay_to, asset=network.token_address,
        amount=challenge_amount(intent, network), issued_at=ctx.now, expires_at=ctx.now + challenge_ttl(),
        requirement=requirement)
    # The 402 of the request that issued it sends this; a replay encodes the stored document again
    # (the same bytes: tests/agentpay_x402/test_402_cost.py).
    challenge.payment_required_header = header
    ctx.insert(challenge)


def _unix(moment: datetime) -> int:
    return int(moment.timestamp())


def payload_verified(ctx: Any, step: Step) -> None:
    if ctx.intent.rail != ONCHAIN:
        return  # the wallet's API-key authorization writes nothing here
    challenge = PaymentChallenge.objects.select_related("network").filter(intent=ctx.intent).first()
    if challenge is None:
        raise Refusal("NO_CHALLENGE", "an on-chain payment answers a challenge; this intent has none", step)
    if ctx.now >= challenge.expires_at:
        raise Refusal("CHALLENGE_EXPIRED", f"the challenge expired at {challenge.expires_at.isoformat()}", step)
    if step.data.get("authorization_state") != "unused":
        raise Refusal("NONCE_STATE_UNCHECKED", "the token's authorizationState(payer, nonce) must be read as unused "
                                               "before the authorization is accepted", step)
    try:
        payload = PaymentPayload.model_validate(step.data.get("payment_payload"))
        auth = verify_payment(payload, terms_of(challenge), now=_unix(ctx.now))
    except ValidationError:
        raise Refusal("MALFORMED_PAYLOAD", "payment_payload is not a v2 PaymentPayload", step) from None
    except PaymentInvalid as invalid:
        raise Refusal(invalid.reason.upper(), invalid.detail, step) from None
    try:
        with transaction.atomic():  # a savepoint: the acceptance goes on to record the refusal
            ChainAuthorization.objects.create(
                intent=ctx.intent, network=challenge.network, token_address=challenge.asset, payer=auth.payer,
                pay_to=auth.to, value=auth.value, valid_after=auth.valid_after, valid_before=auth.valid_before,
                nonce=auth.nonce, signature=auth.signature, payload=step.data["payment_payload"],
                received_at=ctx.now)
    except IntegrityError:
        raise Refusal("NONCE_ALREADY_USED", f"the authorization of {auth.payer} with nonce {auth.nonce} already "
                                            f"pays another intent", step) from None


def payload_invalid(ctx: Any, step: Step) -> None:
    reason = step.data.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise Refusal("REASON_REQUIRED", "payload_invalid says why the payload is invalid (data.reason)", step)


X402_EFFECTS = {
    (INTENT, "challenge_issued"): challenge_issued,
    (INTENT, "payload_verified"): payload_verified,
    (INTENT, "payload_invalid"): payload_invalid,
}
