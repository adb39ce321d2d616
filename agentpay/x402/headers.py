"""The three x402 v2 headers: PAYMENT-REQUIRED (our 402), PAYMENT-SIGNATURE (the payer's signed
payload) and PAYMENT-RESPONSE (how the settlement went).

Encoding uses the SDK's pydantic models and its base64-of-JSON form, so an SDK client decodes
what we send. Decoding a PAYMENT-SIGNATURE is ours and strict: the SDK's decoder accepts any
version and non-canonical base64 and raises whatever pydantic or json raise; an agent's header
is untrusted input and each way it can be wrong has its own reason here.
"""

from __future__ import annotations

import base64
import binascii
import json
from functools import lru_cache
from typing import Any

from pydantic import ValidationError
from x402.http.constants import PAYMENT_REQUIRED_HEADER, PAYMENT_RESPONSE_HEADER, PAYMENT_SIGNATURE_HEADER
from x402.http.utils import encode_payment_required_header, encode_payment_response_header
from x402.schemas import PaymentPayload, PaymentRequired, PaymentRequirements, ResourceInfo, SettleResponse

from config.json_depth import MAX_JSON_DEPTH, json_nesting_exceeds

PAYMENT_REQUIRED = PAYMENT_REQUIRED_HEADER
PAYMENT_SIGNATURE = PAYMENT_SIGNATURE_HEADER
PAYMENT_RESPONSE = PAYMENT_RESPONSE_HEADER
X402_VERSION = 2
SCHEME_EXACT = "exact"
# A signed EIP-3009 payload with its accepted requirements is ~1.2 KB of base64; 8 KiB leaves room
# for extensions and refuses a header meant to cost us memory or log space.
MAX_SIGNATURE_HEADER_CHARS = 8192


class HeaderError(ValueError):
    """A PAYMENT-SIGNATURE that cannot be read as a v2 payment payload.

    `transport`: the header itself is unusable (too large, not base64): nothing was presented,
    so the intent is left as it was (400). Otherwise something was presented and it is not a
    valid payment (the payment is invalid: 402)."""

    def __init__(self, reason: str, detail: str, *, transport: bool = False) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail, self.transport = reason, detail, transport


def exact_requirement(*, caip2: str, asset: str, pay_to: str, amount: int, token_name: str, token_version: str,
                      max_timeout_seconds: int) -> PaymentRequirements:
    """The one `accepts[]` entry of a challenge: scheme exact, an EIP-3009 token on one network."""
    return PaymentRequirements(scheme=SCHEME_EXACT, network=caip2, asset=asset, amount=str(amount), pay_to=pay_to,
                               max_timeout_seconds=max_timeout_seconds,
                               extra={"name": token_name, "version": token_version})


def payment_required(*, resource_url: str, requirement: PaymentRequirements, description: str = "",
                     error: str | None = None) -> PaymentRequired:
    return PaymentRequired(x402_version=X402_VERSION, error=error,
                           resource=ResourceInfo(url=resource_url, description=description or None,
                                                 mime_type=None),
                           accepts=[requirement])


@lru_cache(maxsize=512)
def challenge_json(*, resource_url: str, description: str, caip2: str, asset: str, pay_to: str, amount: int,
                   token_name: str, token_version: str, max_timeout_seconds: int) -> str:
    """The PAYMENT-REQUIRED JSON (the SDK's, as `encode_payment_required` sends it) of a challenge
    with one `exact` requirement. Built through the SDK's models once per terms: a process issues
    402s for a handful of routes and resources, and the models' validation and dump were a tenth
    of an unpaid call's Python."""
    required = payment_required(resource_url=resource_url, description=description, requirement=exact_requirement(
        caip2=caip2, asset=asset, pay_to=pay_to, amount=amount, token_name=token_name, token_version=token_version,
        max_timeout_seconds=max_timeout_seconds))
    return required.model_dump_json(by_alias=True, exclude_none=True)


def encode_json(text: str) -> str:
    """A header value of a document's JSON text: base64 of its UTF-8 (the SDK's safe_base64_encode)."""
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def document(model: PaymentRequired | PaymentPayload | SettleResponse) -> dict[str, Any]:
    """The JSON document of an SDK model, camelCase, without empty optionals (as it is sent)."""
    return json.loads(model.model_dump_json(by_alias=True, exclude_none=True))


def encode_payment_required(required: PaymentRequired) -> str:
    return encode_payment_required_header(required)


def encode_payment_required_document(doc: dict[str, Any]) -> str:
    """Re-send a stored challenge exactly (PaymentChallenge.requirement)."""
    return encode_payment_required(PaymentRequired.model_validate(doc))


def encode_payment_response(*, success: bool, transaction: str, network: str, payer: str | None,
                            amount: int | None = None, error_reason: str | None = None,
                            error_message: str | None = None) -> str:
    return encode_payment_response_header(SettleResponse(
        success=success, transaction=transaction, network=network, payer=payer,
        amount=None if amount is None else str(amount), error_reason=error_reason, error_message=error_message))


def decode_payment_required(value: str) -> PaymentRequired:
    """For buyers and tests: the SDK model of a PAYMENT-REQUIRED header."""
    return PaymentRequired.model_validate_json(base64.b64decode(value, validate=True))


def decode_payment_signature(value: str) -> tuple[PaymentPayload, dict[str, Any]]:
    """(the SDK model, the decoded JSON document) of a PAYMENT-SIGNATURE, or HeaderError."""
    value = value.strip()
    if len(value) > MAX_SIGNATURE_HEADER_CHARS:
        raise HeaderError("header_too_large", f"PAYMENT-SIGNATURE is {len(value)} characters; at most "
                                              f"{MAX_SIGNATURE_HEADER_CHARS}", transport=True)
    if not value:
        raise HeaderError("header_empty", "PAYMENT-SIGNATURE is empty", transport=True)
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise HeaderError("malformed_base64", f"PAYMENT-SIGNATURE is not base64: {exc}", transport=True) from None
    if json_nesting_exceeds(raw):
        raise HeaderError("malformed_json", f"the decoded PAYMENT-SIGNATURE nests more than {MAX_JSON_DEPTH} levels")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise HeaderError("malformed_json", f"the decoded PAYMENT-SIGNATURE is not JSON: {str(exc)[:120]}") from None
    if not isinstance(doc, dict):
        raise HeaderError("malformed_payload", f"the payment payload is a JSON {type(doc).__name__}, not an object")
    version = doc.get("x402Version")
    if version != X402_VERSION or isinstance(version, bool):
        raise HeaderError("unsupported_x402_version", f"x402Version {str(version)[:20]!r}; this gateway speaks "
                                                      f"version {X402_VERSION}")
    try:
        payload = PaymentPayload.model_validate(doc)
    except ValidationError as exc:
        where = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:3])
        raise HeaderError("malformed_payload", f"the payment payload is not a v2 PaymentPayload ({where})") from None
    return payload, doc
