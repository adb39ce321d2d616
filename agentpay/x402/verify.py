"""Whether a presented PAYMENT-SIGNATURE pays the challenge we issued (x402 `exact`, EIP-3009).

Pure: the caller passes the challenge's terms and the trusted time. What needs the chain (the
token's `authorizationState(payer, nonce)`) and the database (one authorization per intent) is
checked by `agentpay.services.onchain_authorize`. The order of the checks is the order an agent
fixes them in: what was accepted (scheme, network, asset, payTo, amount), then the signed
authorization (recipient, value, window), then the signature.

The window (seed §3.1, issue 18): validAfter ≤ now, and now + MIN_VALIDITY < validBefore ≤ the
challenge's expiry + slack. The SDK's client signs validBefore = its own clock + maxTimeoutSeconds
(300) at the moment it signs, which is after we issued the challenge, so validBefore lands a little
after our expiry: the slack (AGENTPAY_X402_VALID_BEFORE_SLACK_SECONDS, default 300) absorbs the
agent's delay and clock skew, and still bounds how long a signed authorization we accept can stay
spendable (what the settlement's "past validBefore and unused → failed" waits for). MIN_VALIDITY
(6 s, the SDK facilitator's own buffer) refuses an authorization that would lapse before it can
be submitted.
"""

from __future__ import annotations

from dataclasses import dataclass

from x402.schemas import PaymentPayload

from agentpay.x402.eip3009 import (
    Authorization,
    AuthorizationMalformed,
    authorization_digest,
    parse_exact_payload,
    recover_signer,
)
from agentpay.x402.headers import SCHEME_EXACT

MIN_VALIDITY_SECONDS = 6


@dataclass(frozen=True)
class Terms:
    """What the challenge asked for (PaymentChallenge + its ChainNetwork)."""

    caip2: str
    chain_id: int
    asset: str  # lowercase
    pay_to: str  # lowercase
    amount: int  # atomic units
    token_name: str
    token_version: str
    expires_at: int  # unix seconds
    valid_before_slack: int


class PaymentInvalid(ValueError):
    """`reason`: a stable snake_case code (the 402's `reason` and the receipt's); `detail`: for people."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


def _same_address(a: str, b: str) -> bool:
    return a.lower() == b.lower()


def verify_payment(payload: PaymentPayload, terms: Terms, *, now: int) -> Authorization:
    """The authorization, or PaymentInvalid with the first thing that is wrong."""
    accepted = payload.accepted
    if accepted.scheme != SCHEME_EXACT:
        raise PaymentInvalid("unsupported_scheme", f"scheme {accepted.scheme[:32]!r}; this route takes 'exact'")
    if accepted.network != terms.caip2:
        raise PaymentInvalid("network_mismatch", f"network {accepted.network[:40]!r}; the challenge is on "
                                                 f"{terms.caip2}")
    if not _same_address(accepted.asset, terms.asset):
        raise PaymentInvalid("asset_mismatch", f"asset {accepted.asset[:44]!r}; the challenge asks for the token "
                                               f"{terms.asset}")
    if not _same_address(accepted.pay_to, terms.pay_to):
        raise PaymentInvalid("recipient_mismatch", f"payTo {accepted.pay_to[:44]!r}; pay {terms.pay_to}")
    if accepted.amount != str(terms.amount):
        raise PaymentInvalid("amount_mismatch", f"amount {accepted.amount[:80]!r}; the challenge asks for exactly "
                                                f"{terms.amount}")
    try:
        auth = parse_exact_payload(payload.payload)
    except AuthorizationMalformed as exc:
        raise PaymentInvalid("malformed_payload", exc.detail) from None
    if auth.to != terms.pay_to:
        raise PaymentInvalid("recipient_mismatch", f"the authorization pays {auth.to}; pay {terms.pay_to}")
    if auth.value != terms.amount:
        raise PaymentInvalid("amount_mismatch", f"the authorization is for {auth.value}; the challenge asks for "
                                                f"exactly {terms.amount} (no partial or over-payment)")
    if auth.valid_after > now:
        raise PaymentInvalid("authorization_not_yet_valid", f"validAfter {auth.valid_after} is in the future "
                                                            f"(now {now})")
    if auth.valid_before <= now + MIN_VALIDITY_SECONDS:
        raise PaymentInvalid("authorization_expired", f"validBefore {auth.valid_before} has passed or is within "
                                                      f"{MIN_VALIDITY_SECONDS} s (now {now})")
    latest = terms.expires_at + terms.valid_before_slack
    if auth.valid_before > latest:
        raise PaymentInvalid("authorization_window_too_long", f"validBefore {auth.valid_before} is after "
                                                              f"{latest} (the challenge's expiry + "
                                                              f"{terms.valid_before_slack} s)")
    digest = authorization_digest(auth, chain_id=terms.chain_id, token=terms.asset, token_name=terms.token_name,
                                  token_version=terms.token_version)
    signer = recover_signer(digest, auth.signature)
    if signer != auth.payer:
        raise PaymentInvalid("invalid_signature", "the signature does not recover to authorization.from (EIP-712 "
                                                  "TransferWithAuthorization on this token's domain)")
    return auth
