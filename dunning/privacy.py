"""Desensitising provider bodies before they are stored (issue 19 item 3, seed 003 数据脱敏).

Provider objects carry a customer's email, name, phone, address and card details. None of that
decides anything here: processing reads ids, amounts, currency, statuses and timestamps, and
fetches the provider's objects again anyway. So what is stored (webhook deliveries, inbox events,
receipts) is the desensitised form, produced by one walk over the JSON:

- keyed hash (`hmac:` + 20 hex of HMAC-SHA256 under PRIVACY_HASH_KEY) where equality still
  matters: an email (the same mailbox in two events compares equal) and a card fingerprint (the
  same card); the key keeps a dictionary attack on known emails out of reach of a database reader;
- mask where only "there was one" matters: a name (`J*** D***`), a phone, an address (every line
  `[redacted]`, the country kept), a card's last four (`**** 4242`), expiry and other card digits
  (`[redacted]`); an email or a card number inside free text (`j***@example.com`, `**** 4242`).

The walk only rewrites values under the keys named below, so ids, amounts, statuses and times are
untouched by construction. It is deterministic (the same input gives the same output, so a
re-delivery stores the same bytes and digests over stored bodies are stable) and idempotent
(masking a masked body changes nothing). Which field gets which treatment, and why: docs/privacy.md.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from typing import Any

from django.conf import settings

from config.json_depth import json_nesting_exceeds

HASH_PREFIX = "hmac:"
HASH_HEX_CHARS = 20
REDACTED = "[redacted]"

# Values where equality matters: keyed hash. (key → hash domain, so an email never equals a fingerprint.)
HASHED_KEYS = {"email": "email", "customer_email": "email", "receipt_email": "email", "fingerprint": "card"}
# A person's name under these keys anywhere; a bare `name` only inside a person's object (below),
# since a product, price or plan `name` is no one's and is shown on pages.
NAME_KEYS = frozenset({"customer_name", "account_holder_name", "cardholder_name", "billing_name"})
PHONE_KEYS = frozenset({"phone", "customer_phone"})
ADDRESS_KEYS = frozenset({"address", "customer_address"})
# Card and bank digits besides the last four, and other identifying numbers: nothing here reads them.
REDACTED_KEYS = frozenset({"exp_month", "exp_year", "iin", "bin", "cvc", "ip_address", "tracking_number",
                           "routing_number", "account_number", "tax_id"})
LAST4_KEYS = frozenset({"last4", "dynamic_last4"})
# An object whose `name` is a person's: a customer, a card, a bank account, a person; or the
# contents of these keys (billing details, shipping, a checkout's customer details).
PERSON_OBJECTS = frozenset({"customer", "card", "bank_account", "person", "source"})
PERSON_CONTAINERS = frozenset({"billing_details", "shipping", "customer_shipping", "shipping_details",
                               "customer_details", "owner", "cardholder", "individual"})
ADDRESS_KEPT = frozenset({"country"})  # the country decides tax, and is nobody's address on its own

# Bounded as RFC 5321 bounds an address (64 before the @, 255 after), so a hostile unsigned body of
# one long token costs linear time, not quadratic.
_EMAIL_IN_TEXT = re.compile(r"([A-Za-z0-9._%+-])[A-Za-z0-9._%+-]{0,63}@([A-Za-z0-9.-]{1,252}\.[A-Za-z]{2,24})")
# 13-19 digits, optionally grouped by spaces or dashes, not part of a longer token (an id, a key).
_CARD_IN_TEXT = re.compile(r"(?<![\w-])(?:\d[ -]?){12,18}\d(?![\w-])")
_MASKED_NAME = re.compile(r"^(\S\*\*\*)( \S\*\*\*)*$")


def _key() -> bytes:
    key = getattr(settings, "PRIVACY_HASH_KEY", "")
    if not key:
        raise RuntimeError("PRIVACY_HASH_KEY is not set; provider bodies cannot be desensitised")
    return key.encode()


def keyed_hash(value: str, domain: str) -> str:
    """`hmac:` + 20 hex digits of HMAC-SHA256(PRIVACY_HASH_KEY, domain:value); already hashed stays."""
    if value.startswith(HASH_PREFIX):
        return value
    if domain == "email":
        value = value.strip().lower()  # one mailbox, however it was typed
    digest = hmac.new(_key(), f"{domain}:{value}".encode(), hashlib.sha256).hexdigest()
    return HASH_PREFIX + digest[:HASH_HEX_CHARS]


def mask_email(text: str) -> str:
    """Every email address in `text` as its first character, `***` and its domain."""
    if "@" not in text:
        return text
    return _EMAIL_IN_TEXT.sub(lambda m: f"{m.group(1)}***@{m.group(2)}", text)


def mask_name(name: str) -> str:
    """`Jane Doe` → `J*** D***`: enough to recognise a case, not to identify a person."""
    if _MASKED_NAME.match(name):
        return name
    return " ".join(f"{word[0]}***" for word in name.split())


def mask_last4(value: str) -> str:
    digits = re.sub(r"\D", "", value)[-4:]
    return f"**** {digits}" if digits else REDACTED


def _luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        n = int(ch) * (2 if i % 2 else 1)
        total += n - 9 if n > 9 else n
    return total % 10 == 0


def mask_text(text: str) -> str:
    """Emails and card numbers (digit runs that pass the Luhn check) inside free text."""
    text = mask_email(text)

    def card(match: re.Match[str]) -> str:
        digits = re.sub(r"\D", "", match.group(0))
        return f"**** {digits[-4:]}" if _luhn_ok(digits) else match.group(0)

    return _CARD_IN_TEXT.sub(card, text)


def _masked_leaf(value: Any, replace: Any) -> Any:
    """Apply `replace` to a present value; null and "" stay (they say "none given", which is no one's data)."""
    if value is None or value == "":
        return value
    if isinstance(value, str) and value == REDACTED:
        return value
    return replace(value)


def _redact(value: Any) -> Any:
    return _masked_leaf(value, lambda _: REDACTED)


def _mask_address(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: (v if k in ADDRESS_KEPT else _redact(v)) for k, v in value.items()}
    return _redact(value)


def _value(key: str, value: Any, person: bool) -> Any:
    if key in HASHED_KEYS and isinstance(value, str):
        return _masked_leaf(value, lambda v: keyed_hash(v, HASHED_KEYS[key]))
    if (key in NAME_KEYS or (key == "name" and person)) and isinstance(value, str):
        return _masked_leaf(value, mask_name)
    if key in PHONE_KEYS and not isinstance(value, (dict, list)):
        return _redact(value)
    if key in ADDRESS_KEYS:
        return _mask_address(value)
    if key in LAST4_KEYS and isinstance(value, str):
        return _masked_leaf(value, mask_last4)
    if key in REDACTED_KEYS and not isinstance(value, (dict, list)):
        return _redact(value)
    return _walk(value, person=key in PERSON_CONTAINERS)


def _walk(node: Any, *, person: bool = False) -> Any:
    if isinstance(node, dict):
        if isinstance(node.get("object"), str):  # an object of its own kind: a person or not, whatever holds it
            person = node["object"] in PERSON_OBJECTS
        return {k: _value(k, v, person) if isinstance(k, str) else v for k, v in node.items()}
    if isinstance(node, list):
        return [_walk(item, person=person) for item in node]
    if isinstance(node, str):
        return mask_text(node)
    return node


def desensitise(document: Any) -> Any:
    """The stored form of a provider JSON document (an event, a fetched object): a new document,
    the input is not changed."""
    return _walk(document)


# Field names whose string value is masked when a body cannot be parsed as JSON (cut at the size
# limit, malformed, nested too deeply to parse safely): the same keys, found textually.
_TEXT_FIELD = re.compile(
    r'"(' + "|".join(sorted(set(HASHED_KEYS) | NAME_KEYS | PHONE_KEYS | LAST4_KEYS | REDACTED_KEYS
                            | {"name", "line1", "line2", "city", "postal_code", "state"}))
    + r')"(\s*:\s*)"((?:[^"\\]|\\.)*)"')


def _mask_unparsed(text: str) -> str:
    def field(match: re.Match[str]) -> str:
        key, colon, value = match.groups()
        if key in HASHED_KEYS:
            stored = keyed_hash(value, HASHED_KEYS[key]) if value else value
        elif key in LAST4_KEYS:
            stored = mask_last4(value) if value else value
        elif key == "name":  # cannot tell a product's name from a person's here: mask both
            stored = mask_name(value) if value else value
        else:
            stored = REDACTED if value else value
        return f'"{key}"{colon}"{stored}"'

    return mask_text(_TEXT_FIELD.sub(field, text))


def desensitise_body(body: bytes) -> bytes:
    """The stored form of a raw request body. A JSON body is parsed, desensitised and, when that
    changed anything, written back compactly (key order kept; otherwise the bytes stay exactly as
    received); anything else (cut, malformed, too deep to parse, not UTF-8) has the
    same fields and any email or card number masked textually, so a rejected delivery is kept
    without the PII it carried."""
    raw = bytes(body)
    if not raw:
        return raw
    if not json_nesting_exceeds(raw):
        try:
            document = json.loads(raw)
        except (ValueError, RecursionError):
            pass  # masked as text below
        else:
            stored = desensitise(document)
            if stored == document:
                return raw  # nothing sensitive in it: kept byte for byte, as received
            try:
                return json.dumps(stored, ensure_ascii=False, separators=(",", ":")).encode()
            except UnicodeEncodeError:  # a lone surrogate (\ud800) in a string: kept escaped
                return json.dumps(stored, separators=(",", ":")).encode()
    return _mask_unparsed(raw.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")
