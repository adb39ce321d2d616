"""The EIP-3009 `transferWithAuthorization` a payer signs (x402 scheme `exact` on EVM).

Parsing is strict and normalizing: addresses lowercase, the nonce `0x` + 64 lowercase hex, the
signature 65 bytes — the forms `agentpay.models.chain` stores, so the unique
(network, token, payer, nonce) never depends on how an agent spelled them. The EIP-712 digest is
the SDK's (`hash_eip3009_authorization`: domain name, version, chainId, verifyingContract).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from eth_keys import keys
from eth_keys.exceptions import BadSignature
from eth_utils import to_checksum_address
from x402.mechanisms.evm.eip712 import hash_eip3009_authorization
from x402.mechanisms.evm.types import ExactEIP3009Authorization

_ADDRESS = re.compile(r"^0x[0-9a-fA-F]{40}$")
_BYTES32 = re.compile(r"^0x[0-9a-fA-F]{64}$")
_SIGNATURE = re.compile(r"^0x[0-9a-fA-F]{130}$")
_UINT = re.compile(r"^[0-9]{1,78}$")
UINT256_MAX = 2**256 - 1
# secp256k1's order / 2: ecrecover in USDC-like tokens (OpenZeppelin ECDSA) refuses a larger s, so
# a signature we would accept must be one the token accepts (no malleable twin).
_HALF_N = 0x7FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF5D576E7357A4501DDFE92F46681B20A0


class AuthorizationMalformed(ValueError):
    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


@dataclass(frozen=True)
class Authorization:
    payer: str  # `from`
    to: str
    value: int
    valid_after: int
    valid_before: int
    nonce: str
    signature: str

    def sdk(self) -> ExactEIP3009Authorization:
        return ExactEIP3009Authorization(from_address=to_checksum_address(self.payer),
                                         to=to_checksum_address(self.to), value=str(self.value),
                                         valid_after=str(self.valid_after), valid_before=str(self.valid_before),
                                         nonce=self.nonce)

    def as_call(self) -> dict[str, Any]:
        """The shape `agentpay.chain.token.transfer_with_authorization_calldata` takes."""
        return {"from": self.payer, "to": self.to, "value": self.value, "validAfter": self.valid_after,
                "validBefore": self.valid_before, "nonce": self.nonce, "signature": self.signature}


def _address(value: Any, name: str) -> str:
    if not isinstance(value, str) or not _ADDRESS.match(value):
        raise AuthorizationMalformed(f"authorization.{name} is not a 0x-prefixed 20-byte address")
    return value.lower()


def _uint(value: Any, name: str) -> int:
    # The SDK sends decimal strings; a JSON integer is accepted too, a float or a bool never.
    if isinstance(value, bool) or not isinstance(value, (str, int)) or not _UINT.match(str(value)):
        raise AuthorizationMalformed(f"authorization.{name} is not a decimal uint256")
    number = int(value)
    if number > UINT256_MAX:
        raise AuthorizationMalformed(f"authorization.{name} exceeds uint256")
    return number


def parse_exact_payload(payload: Any) -> Authorization:
    """The scheme-specific `payload` of an exact EVM PaymentPayload: {signature, authorization}."""
    if not isinstance(payload, dict):
        raise AuthorizationMalformed("payload is not an object")
    auth = payload.get("authorization")
    if not isinstance(auth, dict):
        raise AuthorizationMalformed("payload.authorization is missing (only EIP-3009 is taken, not Permit2)")
    signature = payload.get("signature")
    if not isinstance(signature, str) or not _SIGNATURE.match(signature):
        raise AuthorizationMalformed("payload.signature is not a 0x-prefixed 65-byte signature")
    nonce = auth.get("nonce")
    if not isinstance(nonce, str) or not _BYTES32.match(nonce):
        raise AuthorizationMalformed("authorization.nonce is not a 0x-prefixed 32-byte value")
    return Authorization(payer=_address(auth.get("from"), "from"), to=_address(auth.get("to"), "to"),
                         value=_uint(auth.get("value"), "value"),
                         valid_after=_uint(auth.get("validAfter"), "validAfter"),
                         valid_before=_uint(auth.get("validBefore"), "validBefore"),
                         nonce=nonce.lower(), signature=signature.lower())


def authorization_digest(auth: Authorization, *, chain_id: int, token: str, token_name: str,
                         token_version: str) -> bytes:
    """The EIP-712 hash the payer signed."""
    return hash_eip3009_authorization(auth.sdk(), chain_id, to_checksum_address(token), token_name, token_version)


def recover_signer(digest: bytes, signature: str) -> str | None:
    """The lowercase address that signed `digest`, or None for a signature no token accepts."""
    raw = bytes.fromhex(signature[2:])
    r, s, v = int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:64], "big"), raw[64]
    if v >= 27:
        v -= 27
    if v not in (0, 1) or not r > 0 or not 0 < s <= _HALF_N:
        return None
    try:
        public = keys.Signature(vrs=(v, r, s)).recover_public_key_from_msg_hash(digest)
    except (BadSignature, ValueError):
        return None
    return public.to_checksum_address().lower()
