"""Webhook intake (SPEC §8): verify, deduplicate by event id, hand off; keep every raw request.

Processing happens on Celery after commit; the provider gets its 2xx as soon as the event
is safely in the inbox.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db import IntegrityError, transaction

from config.json_depth import MAX_JSON_DEPTH, json_nesting_exceeds
from dunning.clock import trusted_now
from dunning.handoff import TaskHandoff
from dunning.models import EventOutcome, ProviderEvent, Verification, WebhookDelivery
from dunning.privacy import desensitise, desensitise_body
from dunning.storable import escape_nul, storable_text, unstorable
from subscriptions.providers.base import WebhookVerificationError
from subscriptions.providers.registry import get_provider

log = logging.getLogger(__name__)


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
    """Every request is kept as a WebhookDelivery with its verdict, whatever the outcome.

    The verdict is reached in memory (size, signature, shape), so the raw request is written once,
    with it: a rejected delivery is one insert; an accepted one commits together with its inbox
    row, and the hand-off waits for that commit. Should the inbox write fail, the raw request is
    still kept, marked as failed, before the error reaches the provider (who will deliver again).
    """
    now = now or trusted_now()
    provider = get_provider(provider_name)
    truncated = declared_size > size_limit or len(body) > size_limit
    # The body is stored as bytes (bytea holds any byte); headers are text, where PostgreSQL cannot
    # hold NUL, so a NUL in a header is kept written as \u0000. What is stored is the desensitised
    # body (dunning.privacy): the signature is checked and the digest taken on the raw bytes here, in
    # memory, so a re-delivery of identical bytes has the same digest and the raw PII is never written.
    as_received = dict(
        provider=provider_name, received_at=now, remote_addr=_ip_or_none(remote_addr),
        headers={k: escape_nul(v) for k, v in headers.items() if k.lower() in provider.webhook_headers},
        body=desensitise_body(body[:size_limit]),
        body_size=max(declared_size, len(body)), body_sha256=hashlib.sha256(body).hexdigest(), truncated=truncated,
    )
    raw = WebhookDelivery(**as_received)
    if truncated:
        return _reject(raw, 413, "BODY_TOO_LARGE", f"body over the {size_limit}-byte limit")
    if json_nesting_exceeds(body):
        return _reject(raw, 400, "MALFORMED_PAYLOAD", f"payload is nested too deeply to be a provider event "
                                                      f"(more than {MAX_JSON_DEPTH} levels)")
    try:
        event = provider.verify_notification(payload=body, headers=headers, now=now)
        problem = _malformed_event(event)
    except WebhookVerificationError as exc:
        return _reject(raw, 400, exc.code, str(exc))
    except RecursionError:  # signed JSON nested deeper than the parser goes
        return _reject(raw, 400, "MALFORMED_PAYLOAD", "payload is nested too deeply to be a provider event")
    except Exception as exc:
        _keep_failed(as_received, "VERIFICATION_ERROR", exc)
        raise
    if problem:
        return _reject(raw, 400, "MALFORMED_EVENT", problem)
    try:
        # What the adapter can check at the door (Alipay: the merchant, the order, the amount and
        # currency against what we sent). A verified event that fails it is kept, quarantined
        # and never processed, and the provider hears a refusal.
        quarantine = provider.notification_problem(event)
        with transaction.atomic():
            row, created = _inbox_insert(provider_name, event, now, quarantine=quarantine)
            raw.verification = Verification.VERIFIED
            raw.claimed_event_id = event["id"]
            raw.event = row
            raw.duplicate = not created
            refused = quarantine or _held_at_the_door(row)
            raw.http_status = 400 if refused else 200
            if refused:
                raw.rejection_reason = refused[0]
                raw.detail = escape_nul(refused[1])[:2000]
            raw.save()
            if created and not refused:
                transaction.on_commit(lambda: _enqueue(row.pk))
    except Exception as exc:
        _keep_failed(as_received, "INBOX_WRITE_FAILED", exc)
        raise
    if refused:
        return IntakeOutcome(400, refused[0], refused[1])
    return IntakeOutcome(200, "DUPLICATE" if not created else "RECEIVED",
                         body={"received": True, "event": event["id"], "duplicate": not created})


def _held_at_the_door(row: ProviderEvent) -> tuple[str, str] | None:
    """A redelivery of an event quarantined at the door gets the same refusal."""
    if row.outcome == EventOutcome.QUARANTINED and row.outcome_detail.startswith(DOOR_PREFIX):
        code, _, detail = row.outcome_detail[len(DOOR_PREFIX):].partition(": ")
        return code, detail
    return None


# How a door quarantine is written in the event's outcome detail ("at intake: CODE: detail").
DOOR_PREFIX = "at intake: "


# The Celery task that processes one event (dunning.tasks.process_provider_event), named by
# DunningConfig.ready. If the broker is down (or an in-process run fails) the event stays PENDING
# in the inbox, for the inbox sweep, instead of failing the provider's delivery.
EVENT_HANDOFF = TaskHandoff("event", "the inbox sweep will pick it up")
event_worker_set = EVENT_HANDOFF.set


def _enqueue(event_pk: int) -> None:
    EVENT_HANDOFF.enqueue(event_pk)


def _reject(raw: WebhookDelivery, status: int, code: str, detail: str) -> IntakeOutcome:
    raw.verification = Verification.REJECTED
    raw.rejection_reason = code
    raw.detail = escape_nul(detail)[:2000]
    raw.http_status = status
    raw.save()
    return IntakeOutcome(status, code, detail)


def _keep_failed(as_received: dict[str, Any], code: str, exc: Exception) -> None:
    """Keep the raw request of a delivery that failed on our side (its verdict stays PENDING: it
    was never judged); the provider gets a 5xx and delivers again. Requests are not wrapped in a
    transaction (no ATOMIC_REQUESTS), so this row commits although the error is raised on."""
    log.exception("webhook delivery failed on our side (%s); the raw request is kept", code)
    try:
        WebhookDelivery.objects.create(**as_received, rejection_reason=code,
                                       detail=escape_nul(f"{type(exc).__name__}: {exc}")[:2000], http_status=500)
    except Exception:
        log.exception("the raw request could not be kept either (is the database reachable?)")


def _malformed_event(event: Any) -> str:
    """Why a verified event cannot be stored as an inbox row ("" when it can): the shape the intake
    and processing rely on, text PostgreSQL can hold anywhere in it, and the fields that become
    columns within their column's size."""
    if not isinstance(event, dict):
        return "event is not a JSON object"
    if not isinstance(event.get("id"), str) or not event["id"]:
        return "event has no id"
    if not isinstance(event.get("type"), str) or not event["type"]:
        return "event has no type"
    data = event.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("object"), dict):
        return "event has no data.object"
    fault = unstorable(event)
    if fault:
        return f"event field {fault}"
    for key, column in _COLUMNS.items():
        value = event.get(key)
        if value is None:
            continue
        limit = ProviderEvent._meta.get_field(column).max_length
        if not isinstance(value, str):
            return f"event {key} is not a string"
        if not storable_text(value, limit):
            return f"event {key} is {len(value)} characters long; at most {limit}"
    object_id = data["object"].get("id")
    if object_id is not None and not (isinstance(object_id, str) and storable_text(object_id, OBJECT_ID_MAX_LENGTH)):
        return f"data.object.id is not a provider id (a string of at most {OBJECT_ID_MAX_LENGTH} characters)"
    if _created_at(event) is _OUT_OF_RANGE:
        return "event created is not a Unix timestamp a date can hold"
    return ""


# Event fields stored as their own inbox columns, and the column each goes to.
_COLUMNS = {"id": "event_id", "type": "event_type", "api_version": "api_version", "account": "account"}
# Provider object ids are looked up in (and stored by fetch into) columns of 255 characters.
OBJECT_ID_MAX_LENGTH = 255
_OUT_OF_RANGE = object()


def _created_at(event: dict[str, Any]) -> Any:
    """The provider's `created` as a datetime; None when absent or not an integer (it is only
    informative), _OUT_OF_RANGE when no datetime holds it."""
    created = event.get("created")
    if not isinstance(created, int):
        return None
    try:
        return datetime.fromtimestamp(created, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return _OUT_OF_RANGE


def _ip_or_none(remote_addr: str | None) -> str | None:
    """REMOTE_ADDR as the inet column takes it; anything else (a unix socket path) is not kept."""
    try:
        return str(ipaddress.ip_address(remote_addr)) if remote_addr else None
    except ValueError:
        return None


def _inbox_insert(provider_name: str, event: dict[str, Any], now: datetime,
                  quarantine: tuple[str, str] | None = None) -> tuple[ProviderEvent, bool]:
    """Insert once per (provider, event id); the unique constraint decides between concurrent
    deliveries of the same event. A new event (the common case) costs no read first; a redelivery
    pays for a refused insert."""
    try:
        with transaction.atomic():
            row = ProviderEvent.objects.create(
                provider=provider_name, event_id=event["id"], event_type=event["type"],
                api_version=event.get("api_version") or "", account=event.get("account") or "",
                payload=desensitise(event),
                signature_verified=True, received_at=now, provider_created_at=_created_at(event),
                **({} if quarantine is None else {
                    "outcome": EventOutcome.QUARANTINED, "processed_at": now,
                    "outcome_detail": f"{DOOR_PREFIX}{quarantine[0]}: {quarantine[1]}"[:4000]}),
            )
        return row, True
    except IntegrityError:
        existing = ProviderEvent.objects.filter(provider=provider_name, event_id=event["id"]).first()
        if existing is None:
            raise  # not the duplicate the constraint guards against: let the real cause show
        return existing, False
