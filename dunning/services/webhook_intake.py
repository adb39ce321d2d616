"""Webhook intake (SPEC §8): keep the raw request, verify, deduplicate by event id, hand off.

Processing happens on Celery after commit; the provider gets its 2xx as soon as the event
is safely in the inbox.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db import IntegrityError, transaction

from dunning.clock import trusted_now
from dunning.models import ProviderEvent, Verification, WebhookDelivery
from subscriptions.providers.base import WebhookVerificationError
from subscriptions.providers.registry import get_provider

log = logging.getLogger(__name__)
KEPT_HEADERS = {"stripe-signature", "content-type", "content-length", "user-agent", "x-forwarded-for"}


@dataclass(frozen=True)
class IntakeOutcome:
    status: int
    code: str
    detail: str = ""
    body: dict[str, Any] = field(default_factory=dict)


def webhook_receive(
    *,
    provider_name: str,
    body: bytes,
    headers: dict[str, str],
    remote_addr: str | None,
    declared_size: int,
    size_limit: int,
    now: datetime | None = None,
) -> IntakeOutcome:
    now = now or trusted_now()
    truncated = declared_size > size_limit or len(body) > size_limit
    delivery = WebhookDelivery.objects.create(
        provider=provider_name, received_at=now, remote_addr=remote_addr or None,
        headers={k: v for k, v in headers.items() if k.lower() in KEPT_HEADERS}, body=body[:size_limit],
        body_size=max(declared_size, len(body)), body_sha256=hashlib.sha256(body).hexdigest(), truncated=truncated,
    )
    if truncated:
        return _reject(delivery, 413, "BODY_TOO_LARGE", f"body over the {size_limit}-byte limit")
    signature = next((v for k, v in headers.items() if k.lower() == "stripe-signature"), "")
    try:
        event = get_provider(provider_name).verify_webhook(payload=body, signature_header=signature, now=now)
    except WebhookVerificationError as exc:
        return _reject(delivery, 400, exc.code, str(exc))
    problem = _malformed_event(event)
    if problem:
        return _reject(delivery, 400, "MALFORMED_EVENT", problem)
    # The raw delivery is kept whatever happens next. The inbox row and the delivery's verdict
    # commit together, so a crash cannot leave them disagreeing (and a new event costs one commit
    # fewer); the hand-off waits for that commit.
    with transaction.atomic():
        row, created = _inbox_insert(provider_name, event, now)
        delivery.verification = Verification.VERIFIED
        delivery.claimed_event_id = event["id"]
        delivery.event = row
        delivery.duplicate = not created
        delivery.http_status = 200
        delivery.save(update_fields=["verification", "claimed_event_id", "event", "duplicate", "http_status"])
        if created:
            transaction.on_commit(lambda: _enqueue(row.pk))
    return IntakeOutcome(200, "DUPLICATE" if not created else "RECEIVED",
                         body={"received": True, "event": event["id"], "duplicate": not created})


def _enqueue(event_pk: int) -> None:
    """Hand the event to a worker. The event is already safe in the inbox: if the broker is down
    (or an in-process run fails), it stays PENDING for the inbox sweep instead of failing the
    provider's delivery."""
    from dunning.tasks import process_provider_event

    try:
        process_provider_event.delay(event_pk)
    except Exception:
        log.exception("event %s stored but not handed to a worker; the inbox sweep will pick it up", event_pk)


def _reject(delivery: WebhookDelivery, status: int, code: str, detail: str) -> IntakeOutcome:
    delivery.verification = Verification.REJECTED
    delivery.rejection_reason = code
    delivery.detail = detail[:2000]
    delivery.http_status = status
    delivery.save(update_fields=["verification", "rejection_reason", "detail", "http_status"])
    return IntakeOutcome(status, code, detail)


def _malformed_event(event: dict[str, Any]) -> str:
    if not isinstance(event.get("id"), str) or not event["id"]:
        return "event has no id"
    if not isinstance(event.get("type"), str) or not event["type"]:
        return "event has no type"
    data = event.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("object"), dict):
        return "event has no data.object"
    return ""


def _inbox_insert(provider_name: str, event: dict[str, Any], now: datetime) -> tuple[ProviderEvent, bool]:
    """Insert once per (provider, event id); the unique constraint decides between concurrent
    deliveries of the same event."""
    existing = ProviderEvent.objects.filter(provider=provider_name, event_id=event["id"]).first()
    if existing is not None:
        return existing, False
    created_at = event.get("created")
    try:
        with transaction.atomic():
            row = ProviderEvent.objects.create(
                provider=provider_name, event_id=event["id"], event_type=event["type"],
                api_version=event.get("api_version") or "", account=event.get("account") or "", payload=event,
                signature_verified=True, received_at=now,
                provider_created_at=datetime.fromtimestamp(created_at, tz=UTC) if isinstance(created_at, int)
                else None,
            )
        return row, True
    except IntegrityError:
        return ProviderEvent.objects.get(provider=provider_name, event_id=event["id"]), False
