"""Signed pushes of `entitlement.changed` to subscriber URLs, with per-subscriber retries.

The outbox relay hands each `entitlement.changed` message to `dunning.actions.entitlement_changed.entitlement_changed`,
which creates one `EntitlementDelivery` per (message, active subscriber in the cohort) and tries
each once. A failed delivery is retried by the `entitlement_push` job (entitlements.jobs) with exponential back-off
(30 s, 60 s, 120 s … capped at 1 h; gives up after ENTITLEMENT_PUSH_MAX_ATTEMPTS), on its own:
one failing subscriber never causes a resend to the others.

Each request is ``POST <url>`` with a JSON body::

    {"id": "entitlement.changed:<subscription>:<generation>", "type": "entitlement.changed",
     "subscription": 12, "provider_subscription_id": "sub_…", "generation": 3, "profile": "SUSPENDED",
     "capabilities": {…}, "reason": "…", "issued_at": "2026-12-01T09:00:00+00:00"}

and ``Dunning-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>``. The body
is identical on every attempt; `t` is the sending time. Any 2xx is success; redirects are not
followed. Network calls run outside transactions with a short timeout.
See `entitlements.reference_consumer` for the receiving side.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import urllib.error
import urllib.request
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q

from dunning.claims import claim
from dunning.clock import trusted_now
from dunning.models import OutboxMessage
from entitlements.models import DeliveryStatus, EntitlementDelivery, EntitlementSubscriber

SIGNATURE_HEADER = "Dunning-Signature"
MESSAGE_ID_HEADER = "Dunning-Message-Id"
PUSH_FIELDS = ("subscription", "provider_subscription_id", "generation", "profile", "capabilities", "reason",
               "issued_at")


def push_body(message: OutboxMessage) -> bytes:
    payload = message.payload if isinstance(message.payload, dict) else {}
    body: dict[str, Any] = {"id": message.dedupe_key, "type": message.topic}
    body.update({name: payload.get(name) for name in PUSH_FIELDS})
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def push_signature(secret: str, timestamp: int, body: bytes) -> str:
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def push_backoff(attempts: int) -> timedelta:
    base = settings.ENTITLEMENT_PUSH_BACKOFF_BASE_SECONDS
    return timedelta(seconds=min(base * 2 ** max(attempts - 1, 0), settings.ENTITLEMENT_PUSH_BACKOFF_MAX_SECONDS))


def entitlement_deliveries_create(*, message: OutboxMessage, now: datetime) -> int:
    """One delivery row per active subscriber of the message's cohort (idempotent). Returns how
    many subscribers the message is for."""
    subscribers = EntitlementSubscriber.objects.filter(active=True)
    if message.subscription_id is not None:
        subscribers = subscribers.filter(Q(cohort="") | Q(cohort=message.subscription.cohort))
    rows = [EntitlementDelivery(message=message, subscriber=s, created_at=now, next_attempt_at=now)
            for s in subscribers]
    EntitlementDelivery.objects.bulk_create(rows, ignore_conflicts=True)
    return len(rows)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a redirect is answered as the 3xx it is: a failed delivery


_opener = urllib.request.build_opener(_NoRedirect)


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int | None, str]:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with _opener.open(request, timeout=settings.ENTITLEMENT_PUSH_TIMEOUT_SECONDS) as response:
            return response.status, ""
    except urllib.error.HTTPError as exc:
        return exc.code, f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return None, f"{type(exc).__name__}: {exc}"[:2000]


def entitlement_delivery_attempt(*, delivery_pk: int, now: datetime) -> str:
    """Try one delivery once, if it is due and no other worker holds it. Returns DELIVERED,
    RETRY, GAVE_UP or SKIPPED. Must not run inside a transaction (it makes a network call)."""
    with claim("entitlement_push", delivery_pk) as got:
        if not got:
            return "SKIPPED"
        delivery = (EntitlementDelivery.objects.select_related("message", "subscriber")
                    .filter(pk=delivery_pk, status=DeliveryStatus.PENDING).first())
        if delivery is None or (delivery.next_attempt_at and delivery.next_attempt_at > now):
            return "SKIPPED"
        body = push_body(delivery.message)
        headers = {
            "Content-Type": "application/json", "User-Agent": "dunning-entitlement-push/1",
            MESSAGE_ID_HEADER: delivery.message.dedupe_key,
            SIGNATURE_HEADER: push_signature(delivery.subscriber.secret, int(trusted_now().timestamp()), body),
        }
        status_code, error = _post(delivery.subscriber.url, body, headers)
        attempts = delivery.attempts + 1
        fields: dict[str, Any] = {"attempts": attempts, "last_status_code": status_code, "last_error": error}
        if status_code is not None and 200 <= status_code < 300:
            outcome = "DELIVERED"
            fields.update(status=DeliveryStatus.DELIVERED, delivered_at=now, next_attempt_at=None, last_error="")
        elif attempts >= settings.ENTITLEMENT_PUSH_MAX_ATTEMPTS:
            outcome = "GAVE_UP"
            fields.update(status=DeliveryStatus.GAVE_UP, next_attempt_at=None)
        else:
            outcome = "RETRY"
            fields.update(next_attempt_at=now + push_backoff(attempts))
        EntitlementDelivery.objects.filter(pk=delivery.pk, attempts=delivery.attempts).update(**fields)
        return outcome


def message_deliveries_attempt(*, message: OutboxMessage, now: datetime) -> dict[str, int]:
    """Create the message's delivery rows and try each pending one once."""
    entitlement_deliveries_create(message=message, now=now)
    counts: dict[str, int] = {}
    pending = EntitlementDelivery.objects.filter(message=message, status=DeliveryStatus.PENDING)
    for pk in pending.order_by("pk").values_list("pk", flat=True):
        outcome = entitlement_delivery_attempt(delivery_pk=pk, now=now)
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts
