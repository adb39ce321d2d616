"""A small reference receiver for entitlement pushes: copy it into a runtime service.

What a receiver must do with ``POST`` bodies from `entitlements.push`:

1. **Verify the signature** before parsing: header ``Dunning-Signature: t=<unix>,v1=<hex>``
   where ``hex = HMAC-SHA256(secret, f"{t}.{raw body}")``. Compare in constant time; accept any
   of several ``v1`` values (lets the sender roll secrets). Reject when ``|now - t|`` exceeds the
   tolerance (default 300 s): an old captured request cannot be replayed later.
2. **Ignore a replayed message id** (``id`` in the body; also sent as ``Dunning-Message-Id``):
   delivery is at least once, so the same message may arrive twice.
3. **Keep the highest generation per subscription**: a push whose ``generation`` is lower than
   or equal to the one held is ignored (pushes and retries may arrive out of order).
4. Answer 2xx once the entitlement is stored (or knowingly ignored); anything else is retried
   by the sender with back-off.

Usage::

    consumer = ReferenceConsumer(secret="whsec_…")
    outcome = consumer.receive(raw_body, headers["Dunning-Signature"])   # APPLIED / STALE / DUPLICATE
    consumer.entitlement(12)  # {"generation": 3, "profile": "SUSPENDED", "capabilities": {…}, …}

or serve ``consumer.wsgi_app`` (any WSGI server): 204 when applied or ignored, 400 when the
signature or timestamp is bad. State is in memory here; a real service keeps the generation
and the seen ids in its own store, updated in one transaction with the entitlement.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

APPLIED = "APPLIED"
STALE = "STALE"  # generation lower than or equal to the one held
DUPLICATE = "DUPLICATE"  # message id seen before


class SignatureError(ValueError):
    """The signature is missing, malformed, wrong, or its timestamp is outside the tolerance."""


def verify_signature(*, secret: str, header: str, body: bytes, now: float, tolerance_seconds: int = 300) -> None:
    """Raise SignatureError unless `header` signs `body` with `secret` within the tolerance."""
    timestamp: int | None = None
    candidates: list[str] = []
    for part in (header or "").split(","):
        name, _, value = part.strip().partition("=")
        if name == "t":
            try:
                timestamp = int(value)
            except ValueError:
                raise SignatureError("malformed timestamp") from None
        elif name == "v1":
            candidates.append(value)
    if timestamp is None or not candidates:
        raise SignatureError("signature header must carry t= and v1=")
    if abs(now - timestamp) > tolerance_seconds:
        raise SignatureError("timestamp outside the tolerance")
    expected = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    if not any(hmac.compare_digest(expected, c) for c in candidates):
        raise SignatureError("signature does not match")


class ReferenceConsumer:
    def __init__(self, *, secret: str, tolerance_seconds: int = 300, clock: Callable[[], float] = time.time,
                 remember_ids: int = 100_000) -> None:
        self.secret = secret
        self.tolerance_seconds = tolerance_seconds
        self.clock = clock
        self.remember_ids = remember_ids
        self._held: dict[Any, dict[str, Any]] = {}
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()
        self.log: list[tuple[str, str]] = []  # (message id, outcome), for inspection

    def entitlement(self, subscription: Any) -> dict[str, Any] | None:
        with self._lock:
            return self._held.get(subscription)

    def receive(self, body: bytes, signature_header: str) -> str:
        verify_signature(secret=self.secret, header=signature_header, body=body, now=self.clock(),
                         tolerance_seconds=self.tolerance_seconds)
        message = json.loads(body)
        message_id, subscription, generation = str(message["id"]), message["subscription"], int(message["generation"])
        with self._lock:
            if message_id in self._seen:
                outcome = DUPLICATE
            else:
                self._remember(message_id)
                held = self._held.get(subscription)
                if held is not None and generation <= held["generation"]:
                    outcome = STALE
                else:
                    self._held[subscription] = {k: message.get(k) for k in (
                        "generation", "profile", "capabilities", "reason", "issued_at", "provider_subscription_id")}
                    outcome = APPLIED
            self.log.append((message_id, outcome))
        return outcome

    def _remember(self, message_id: str) -> None:
        self._seen[message_id] = None
        while len(self._seen) > self.remember_ids:
            self._seen.popitem(last=False)

    def wsgi_app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") != "POST":
            start_response("405 Method Not Allowed", [("Allow", "POST")])
            return [b""]
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        try:
            self.receive(body, environ.get("HTTP_DUNNING_SIGNATURE", ""))
        except SignatureError as exc:
            start_response("400 Bad Request", [("Content-Type", "text/plain")])
            return [str(exc).encode()]
        except (ValueError, KeyError, TypeError):
            start_response("400 Bad Request", [("Content-Type", "text/plain")])
            return [b"malformed body"]
        start_response("204 No Content", [])
        return [b""]
