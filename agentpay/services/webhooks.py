"""Signed callbacks to tenants: the outbox consumer that POSTs an intent's changes to its tenant.

A tenant configures one endpoint (`tenant_webhook_configure`, shown its secret once). For every
outbox row of one of its intents, the consumer POSTs

    {"id": "<dedupe_key>", "type": "agentpay.intent.changed", "created_at": …, "data": <payload>}

with `AgentPay-Event-Id: <dedupe_key>` and `AgentPay-Signature: t=<unix>,v1=<hex>`, where v1 is
HMAC-SHA256 with the tenant's secret over `<t>.<body>` (Stripe's scheme: the timestamp is
signed too, so an old body cannot be replayed as new). A `WebhookDelivery` row per (message,
tenant), unique, is the dedupe record: a delivered row is never sent again, however often the
relay publishes the message. Each POST is a `WebhookAttempt` row with its HTTP outcome. A non-2xx
or no answer raises, so the relay leaves the message for its next run (at least once); a tenant
without an endpoint gets nothing, and nothing is recorded.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db import transaction
from django.db.models import F

from agentpay.bridge import trusted_now
from agentpay.models import OutboxMessage, Tenant, TenantWebhookEndpoint, WebhookAttempt, WebhookDelivery
from agentpay.upstream import callback_host_problem, callback_post

SECRET_PREFIX = "whsec_ap_"
SIGNATURE_HEADER = "AgentPay-Signature"


class WebhookRefused(Exception):
    pass


class WebhookNotDelivered(Exception):
    """The receiver did not take the callback (non-2xx, no answer); the relay retries later."""


def _derive(salt: str) -> str:
    key = (settings.AGENTPAY_WEBHOOK_SIGNING_KEY or settings.SECRET_KEY).encode()
    return SECRET_PREFIX + hmac.new(key, f"agentpay-webhook:{salt}".encode(), hashlib.sha256).hexdigest()


def _digest(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def tenant_webhook_configure(*, tenant: Tenant, url: str, rotate_secret: bool = False
                             ) -> tuple[TenantWebhookEndpoint, str | None]:
    """Set the tenant's callback URL. A new endpoint, or `rotate_secret`, gets a new secret,
    returned once (otherwise None: the secret stays as it was)."""
    try:
        URLValidator(schemes=["http", "https"])(url)
    except ValidationError:
        raise WebhookRefused(f"not an http(s) URL: {url[:200]!r}") from None
    if not settings.AGENTPAY_WEBHOOK_ALLOW_PRIVATE_ADDRESSES and (problem := callback_host_problem(url)):
        raise WebhookRefused(f"callbacks go to public addresses only: {problem}")
    with transaction.atomic():
        endpoint = TenantWebhookEndpoint.objects.select_for_update().filter(tenant=tenant).first()
        raw = None
        if endpoint is None or rotate_secret:
            salt = secrets.token_hex(16)
            raw = _derive(salt)
            secret = {"secret_salt": salt, "secret_prefix": raw[:14], "secret_hash": _digest(raw)}
        if endpoint is None:
            endpoint = TenantWebhookEndpoint.objects.create(tenant=tenant, url=url, **secret)
        else:
            endpoint.url, endpoint.active = url, True
            if raw is not None:
                for name, value in secret.items():
                    setattr(endpoint, name, value)
                endpoint.secret_rotated_at = trusted_now()
            endpoint.save()
    return endpoint, raw


def tenant_webhook_disable(*, tenant: Tenant) -> int:
    return TenantWebhookEndpoint.objects.filter(tenant=tenant).update(active=False)


def signature(secret: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def _body(message: OutboxMessage) -> bytes:
    event: dict[str, Any] = {"id": message.dedupe_key, "type": message.topic,
                             "created_at": message.created_at.isoformat(), "data": message.payload}
    return json.dumps(event, sort_keys=True, separators=(",", ":")).encode()


def webhook_deliver(message: OutboxMessage) -> None:
    """The outbox consumer: POST `message` to its tenant's endpoint, at most once successfully."""
    tenant_id = message.intent.tenant_id
    endpoint = TenantWebhookEndpoint.objects.filter(tenant_id=tenant_id, active=True).first()
    if endpoint is None:
        return
    WebhookDelivery.objects.bulk_create([WebhookDelivery(message=message, tenant_id=tenant_id, url=endpoint.url,
                                                         dedupe_key=message.dedupe_key, created_at=trusted_now())],
                                        ignore_conflicts=True)
    delivery = WebhookDelivery.objects.get(message=message, tenant_id=tenant_id)
    if delivery.delivered_at is not None:
        return  # sent before: a repeat publish sends nothing
    secret = _derive(endpoint.secret_salt)
    if not hmac.compare_digest(_digest(secret), endpoint.secret_hash):
        _record(delivery, None, "the signing key changed: this endpoint's secret cannot be derived; rotate it")
        raise WebhookNotDelivered(f"{delivery.dedupe_key}: cannot sign for {endpoint.url}")
    body, sent_at = _body(message), trusted_now()
    timestamp = int(sent_at.timestamp())
    answer = callback_post(url=endpoint.url, body=body, timeout=settings.AGENTPAY_WEBHOOK_TIMEOUT_SECONDS,
                           allow_private=settings.AGENTPAY_WEBHOOK_ALLOW_PRIVATE_ADDRESSES, headers={
        "AgentPay-Event-Id": message.dedupe_key, SIGNATURE_HEADER: signature(secret, timestamp, body),
        "User-Agent": "AgentPay-Webhooks/1"})
    WebhookAttempt.objects.create(delivery=delivery, attempted_at=sent_at, url=endpoint.url,
                                  http_status=answer.status, latency_ms=answer.latency_ms, error=answer.error,
                                  body_digest=hashlib.sha256(body).hexdigest(), signature_timestamp=timestamp)
    ok = answer.status is not None and 200 <= answer.status < 300
    _record(delivery, answer.status, answer.error or ("" if ok else f"HTTP {answer.status}"), delivered=ok)
    if not ok:
        raise WebhookNotDelivered(f"{delivery.dedupe_key} → {endpoint.url}: "
                                  f"{answer.error or f'HTTP {answer.status}'}")


def _record(delivery: WebhookDelivery, status: int | None, error: str, *, delivered: bool = False) -> None:
    now = trusted_now()
    WebhookDelivery.objects.filter(pk=delivery.pk).update(
        attempts=F("attempts") + 1, last_status=status, last_error=error[:2000], last_attempt_at=now,
        **({"delivered_at": now} if delivered else {}))
