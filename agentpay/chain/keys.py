"""The rail's signing keys: setting AGENTPAY_CHAIN_KEYS, a JSON object address → private key (or
a dict). Never in the database, never logged: errors name the address, not the key."""

from __future__ import annotations

import json

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


def _keys() -> dict[str, str]:
    raw = getattr(settings, "AGENTPAY_CHAIN_KEYS", {}) or {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            # The message must not echo the value: it holds keys.
            raise ImproperlyConfigured(f"AGENTPAY_CHAIN_KEYS is not valid JSON (at char {exc.pos})") from None
    if not isinstance(raw, dict):
        raise ImproperlyConfigured("AGENTPAY_CHAIN_KEYS must be a JSON object address -> private key")
    return {str(address).lower(): str(key) for address, key in raw.items()}


def private_key_for(address: str) -> str:
    """The 0x-hex private key of `address` (any casing)."""
    key = _keys().get(address.lower())
    if not key:
        raise ImproperlyConfigured(f"AGENTPAY_CHAIN_KEYS has no key for {address.lower()}")
    return key if key.startswith("0x") else "0x" + key
