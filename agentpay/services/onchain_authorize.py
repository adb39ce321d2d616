"""The on-chain rail up to the authorization (seed 004 §3.1, §4.1; issue 18): challenge the
unpaid call, then take the payer's signed EIP-3009 authorization or reject it.

created --challenge_issued--> challenged (a PaymentChallenge written in the same acceptance)
challenged --payload_verified--> authorized (the ChainAuthorization written in the same acceptance)
challenged --payload_invalid--> rejected (the reason on the receipt and in the 402)
challenged --timeout--> expired (the challenge_expiry job, or the next request, after 300 s)

A PAYMENT-SIGNATURE on a key that was never challenged (the agent knew the terms from another
402) is challenged and verified in the same request: created → challenged → authorized, two
acceptances, so the challenge it is checked against is on record like any other.

Every check that can be made before the acceptance is made here, outside any transaction: the
header, the terms, the signature, the database (one authorization per intent), and the token's
`authorizationState(payer, nonce)` — the only network call. The acceptance's effect
(`x402_effects.payload_verified`) checks the terms again at its own time, and the unique
constraint decides a race between two intents presenting one authorization.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agentpay.bridge import ApiAccess, trusted_now
from agentpay.chain.rpc import ChainRejected, ChainTimeout
from agentpay.chain.token import authorization_state
from agentpay.models import (
    ChainAuthorization,
    ChainNetwork,
    IntentReceipt,
    PaymentChallenge,
    PaymentIntent,
    Tenant,
    TenantStatus,
)
from agentpay.services.acceptance import intent_accept
from agentpay.services.results import Cause, Outcome, Step
from agentpay.services.x402_effects import terms_of
from agentpay.states import INTENT
from agentpay.x402.headers import HeaderError, decode_payment_signature
from agentpay.x402.verify import PaymentInvalid, verify_payment

# What Presented.status says happened.
AUTHORIZED, INVALID, EXPIRED, UNREADABLE, CHAIN_UNAVAILABLE, DENIED, REFUSED = (
    "authorized", "invalid", "expired", "unreadable", "chain_unavailable", "denied", "refused")
# Refusals of payload_verified that mean the payment itself is invalid (→ payload_invalid).
_INVALID_REFUSALS = frozenset({
    "NONCE_ALREADY_USED", "MALFORMED_PAYLOAD", "UNSUPPORTED_SCHEME", "NETWORK_MISMATCH", "ASSET_MISMATCH",
    "RECIPIENT_MISMATCH", "AMOUNT_MISMATCH", "AUTHORIZATION_NOT_YET_VALID", "AUTHORIZATION_EXPIRED",
    "AUTHORIZATION_WINDOW_TOO_LONG", "INVALID_SIGNATURE"})


class ChainUnavailable(Exception):
    """The token's nonce state could not be read: nothing is decided, the intent stays challenged."""


@dataclass(frozen=True)
class Presented:
    status: str
    outcome: Outcome | None = None
    reason: str = ""
    detail: str = ""


def authorization_used_on_chain(network: ChainNetwork, payer: str, nonce: str) -> bool:
    """The token's authorizationState(payer, nonce): used or canceled."""
    try:
        return bool(authorization_state(network, payer, nonce))
    except (ChainTimeout, ChainRejected) as exc:
        raise ChainUnavailable(f"authorizationState on {network.caip2}: {str(exc)[:200]}") from None


def onchain_policy_refusal(tenant_status: str, access: ApiAccess) -> tuple[str, str]:
    """(reason, detail) why a tenant in `tenant_status` may not be challenged; ('', '') when it may."""
    if tenant_status == TenantStatus.FROZEN:
        return "tenant_frozen", "the tenant is frozen"
    if not access.allowed:
        return "entitlement_denies_api_tokens", access.detail
    return "", ""


def _policy_refusal(intent: PaymentIntent, access: ApiAccess) -> tuple[str, str]:
    status = Tenant.objects.filter(pk=intent.tenant_id).values_list("status", flat=True).get()
    return onchain_policy_refusal(status, access)


def onchain_challenge(*, intent: PaymentIntent, cause: Cause, access: ApiAccess, resource: str,
                      now: datetime | None = None) -> Outcome:
    """created → challenged (or policy_denied → rejected)."""
    reason, why = _policy_refusal(intent, access)
    if reason:
        return intent_accept(intent_id=intent.intent_id, cause=cause, now=now or trusted_now(),
                             steps=[Step(INTENT, "policy_denied", {"reason": reason, "detail": why})])
    return intent_accept(intent_id=intent.intent_id, cause=cause, now=now or trusted_now(),
                         steps=[Step(INTENT, "challenge_issued", {"resource": resource})])


def onchain_expire_challenge(*, intent: PaymentIntent, cause: Cause, now: datetime | None = None) -> Outcome | None:
    """A challenge past its TTL is expired at once by the request that notices (the job would do it
    within a minute); None while it is still open."""
    now = now or trusted_now()
    challenge = PaymentChallenge.objects.filter(intent=intent).only("expires_at").first()
    if challenge is None or now < challenge.expires_at:
        return None
    return intent_accept(intent_id=intent.intent_id, cause=cause, now=now, steps=[Step(INTENT, "timeout")])


def onchain_reject(*, intent: PaymentIntent, cause: Cause, reason: str, detail: str,
                   now: datetime | None = None) -> Presented:
    outcome = intent_accept(intent_id=intent.intent_id, cause=cause, now=now or trusted_now(),
                            steps=[Step(INTENT, "payload_invalid", {"reason": reason, "detail": detail[:500]})])
    return Presented(INVALID if outcome.accepted else REFUSED, outcome, reason, detail)


def onchain_present(*, intent: PaymentIntent, header: str, cause: Cause, access: ApiAccess, resource: str,
                    now: datetime | None = None) -> Presented:
    """Take a PAYMENT-SIGNATURE for a created or challenged intent."""
    now = now or trusted_now()
    doc: dict[str, Any] | None = None
    bad: tuple[str, str] | None = None
    try:
        payload, doc = decode_payment_signature(header)
    except HeaderError as exc:
        if exc.transport:  # nothing readable was presented: the intent stays as it is
            return Presented(UNREADABLE, None, exc.reason, exc.detail)
        bad = (exc.reason, exc.detail)
    intent.refresh_from_db(fields=["state", "generation"])
    if intent.state == "created":
        outcome = onchain_challenge(intent=intent, cause=cause, access=access, resource=resource, now=now)
        if not outcome.accepted:
            return Presented(REFUSED, outcome, outcome.refusal_code.lower(), outcome.detail)
        if outcome.lines.intent != "challenged":
            return Presented(DENIED, outcome, "policy_denied", outcome.detail)
    expired = onchain_expire_challenge(intent=intent, cause=cause, now=now)
    if expired is not None:
        return Presented(EXPIRED if expired.accepted else REFUSED, expired, "challenge_expired",
                         "the challenge was not answered within its 300 s")
    if bad is not None:
        return onchain_reject(intent=intent, cause=cause, reason=bad[0], detail=bad[1], now=now)
    challenge = PaymentChallenge.objects.select_related("network").get(intent=intent)
    try:
        auth = verify_payment(payload, terms_of(challenge), now=int(now.timestamp()))
    except PaymentInvalid as invalid:
        return onchain_reject(intent=intent, cause=cause, reason=invalid.reason, detail=invalid.detail, now=now)
    holder = (ChainAuthorization.objects.filter(network=challenge.network, token_address=challenge.asset,
                                                payer=auth.payer, nonce=auth.nonce)
              .values_list("intent__intent_id", flat=True).first())
    if holder is not None:
        return onchain_reject(intent=intent, cause=cause, reason="nonce_already_used",
                              detail=f"this authorization (nonce {auth.nonce}) already pays another intent", now=now)
    try:
        used = authorization_used_on_chain(challenge.network, auth.payer, auth.nonce)
    except ChainUnavailable as exc:
        return Presented(CHAIN_UNAVAILABLE, None, "chain_unavailable", str(exc))
    if used:
        return onchain_reject(intent=intent, cause=cause, reason="nonce_already_used",
                              detail=f"the token reports authorizationState({auth.payer}, {auth.nonce}) used or "
                                     f"canceled", now=now)
    outcome = intent_accept(intent_id=intent.intent_id, cause=cause, now=now, steps=[Step(
        INTENT, "payload_verified", {"payment_payload": doc, "authorization_state": "unused", "payer": auth.payer,
                                     "nonce": auth.nonce})])
    if outcome.accepted:
        return Presented(AUTHORIZED, outcome)
    if outcome.refusal_code in _INVALID_REFUSALS:
        return onchain_reject(intent=intent, cause=cause, reason=outcome.refusal_code.lower(),
                              detail=outcome.detail, now=now)
    if outcome.refusal_code == "CHALLENGE_EXPIRED":
        expired = onchain_expire_challenge(intent=intent, cause=cause, now=now)
        return Presented(EXPIRED, expired, "challenge_expired", outcome.detail)
    return Presented(REFUSED, outcome, outcome.refusal_code.lower(), outcome.detail)


def onchain_rejection(intent: PaymentIntent) -> tuple[str, str]:
    """(reason, detail) of a rejected intent's payload_invalid, for its replays."""
    receipt = (IntentReceipt.objects.filter(intent=intent, line=INTENT, event__in=["payload_invalid", "policy_denied"],
                                            accepted=True).order_by("-pk").first())
    if receipt is None:
        return "", ""
    return str(receipt.data.get("reason", "")), str(receipt.data.get("detail", ""))


def onchain_same_payment(intent: PaymentIntent, header: str) -> bool:
    """Whether `header` is the PAYMENT-SIGNATURE this intent's authorization was taken from."""
    stored = ChainAuthorization.objects.filter(intent=intent).values_list("payload", flat=True).first()
    try:
        _, doc = decode_payment_signature(header)
    except HeaderError:
        return False
    return stored is not None and doc == stored
