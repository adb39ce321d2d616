"""Signing webhook bodies the way Stripe does, for tests that post directly."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any


def stripe_signature(body: bytes, secret: str, *, timestamp: int | None = None, scheme: str = "v1") -> str:
    ts = int(time.time()) if timestamp is None else timestamp
    mac = hmac.new(secret.encode(), f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={ts},{scheme}={mac}"


def event_body(event_id: str = "evt_1", event_type: str = "invoice.paid", obj: dict[str, Any] | None = None,
               **extra: Any) -> bytes:
    event = {"id": event_id, "object": "event", "type": event_type, "created": int(time.time()),
             "api_version": "2026-10-28.endive", "data": {"object": obj or {"id": "in_1", "object": "invoice"}},
             "livemode": False, "account": "acct_demo", **extra}
    return json.dumps(event).encode()
