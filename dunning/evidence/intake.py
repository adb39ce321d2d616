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

from django.db import DEFAULT_DB_ALIAS, IntegrityError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Model

from config.json_depth import MAX_JSON_DEPTH, json_nesting_exceeds
from dunning.clock import trusted_now
from dunning.evidence.connection_health import health_check_without_round_trip
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
    health_check_without_round_trip(connections[DEFAULT_DB_ALIAS])
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
        raw.verification = Verification.VERIFIED
        raw.claimed_event_id = event["id"]
        refused = _answer(raw, quarantine)
        event_pk = _insert_new_event(_inbox_row(provider_name, event, now, quarantine), raw)
        created = event_pk is not None
        if not created:
            refused = _keep_redelivery(raw, provider_name, event["id"], quarantine)
        elif not refused:
            transaction.on_commit(lambda: _enqueue(event_pk))
    except Exception as exc:
        _keep_failed(as_received, "INBOX_WRITE_FAILED", exc)
        raise
    if refused:
        return IntakeOutcome(400, refused[0], refused[1])
    return IntakeOutcome(200, "DUPLICATE" if not created else "RECEIVED",
                         body={"received": True, "event": event["id"], "duplicate": not created})


def _answer(raw: WebhookDelivery, refused: tuple[str, str] | None) -> tuple[str, str] | None:
    """Write the verdict a verified delivery gets onto its raw request: 200, or the refusal."""
    raw.http_status = 400 if refused else 200
    if refused:
        raw.rejection_reason = refused[0]
        raw.detail = escape_nul(refused[1])[:2000]
    return refused


def _keep_redelivery(raw: WebhookDelivery, provider_name: str, event_id: str,
                     quarantine: tuple[str, str] | None) -> tuple[str, str] | None:
    """The event is in the inbox already (the insert found it there, committed: ON CONFLICT waits
    for a concurrent delivery's transaction). The delivery is kept pointing at it, with the answer
    the first delivery got when it was held at the door."""
    row = ProviderEvent.objects.only("pk", "outcome", "outcome_detail").get(provider=provider_name,
                                                                           event_id=event_id)
    raw.event = row
    raw.duplicate = True
    refused = _answer(raw, quarantine or _held_at_the_door(row))
    raw.save()
    return refused


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


def _inbox_row(provider_name: str, event: dict[str, Any], now: datetime,
               quarantine: tuple[str, str] | None) -> ProviderEvent:
    return ProviderEvent(
        provider=provider_name, event_id=event["id"], event_type=event["type"],
        api_version=event.get("api_version") or "", account=event.get("account") or "",
        payload=desensitise(event),
        signature_verified=True, received_at=now, provider_created_at=_created_at(event),
        **({} if quarantine is None else {
            "outcome": EventOutcome.QUARANTINED, "processed_at": now,
            "outcome_detail": f"{DOOR_PREFIX}{quarantine[0]}: {quarantine[1]}"[:4000]}),
    )


def _insert_new_event(row: ProviderEvent, raw: WebhookDelivery) -> int | None:
    """Insert the inbox row and, only if it is new, its raw request pointing at it: one statement,
    so one round trip and atomic on its own (no BEGIN, savepoint or COMMIT). Returns the new event's
    pk, or None when (provider, event id) is taken: the unique constraint decides between
    concurrent deliveries of the same event, and a redelivery writes nothing here.

    The columns and values are the models' own (`_insert_values`), as Django's INSERT would send
    them; an INSERT ... SELECT gives the literals the target columns' types."""
    db = connections[DEFAULT_DB_ALIAS]  # the connection itself: each use of the proxy is a thread-local lookup
    if db.vendor != "postgresql":
        return _insert_new_event_orm(row, raw)
    event_columns, event_values = _insert_values(db, row)
    raw_columns, raw_values = _insert_values(db, raw, but="event")
    qn = db.ops.quote_name
    sql = (
        f"WITH new_event AS ("
        f"INSERT INTO {qn(ProviderEvent._meta.db_table)} ({', '.join(event_columns)}) "
        f"VALUES ({', '.join(['%s'] * len(event_values))}) "
        f"ON CONFLICT ({qn('provider')}, {qn('event_id')}) DO NOTHING RETURNING id"
        f"), new_delivery AS ("
        f"INSERT INTO {qn(WebhookDelivery._meta.db_table)} ({', '.join(raw_columns)}, {qn('event_id')}) "
        f"SELECT {', '.join(['%s'] * len(raw_values))}, new_event.id FROM new_event"
        f") SELECT id FROM new_event"
    )
    with db.cursor() as cursor:
        cursor.execute(sql, event_values + raw_values)
        found = cursor.fetchone()
    return None if found is None else found[0]


def _insert_new_event_orm(row: ProviderEvent, raw: WebhookDelivery) -> int | None:
    """The same two inserts through the ORM, for the embedded SQLite demo (no INSERT in a CTE there)."""
    with transaction.atomic():
        try:
            with transaction.atomic():
                row.save(force_insert=True)
        except IntegrityError:
            return None
        raw.event = row
        raw.save(force_insert=True)
    return row.pk


def _insert_values(db: BaseDatabaseWrapper, obj: Model, but: str = "") -> tuple[list[str], list[Any]]:
    """The quoted columns and database values Django's own INSERT of `obj` would use (defaults
    applied, each field's conversion), leaving out the primary key and the field named `but`."""
    fields = [f for f in obj._meta.local_concrete_fields if not f.primary_key and f.name != but]
    return ([db.ops.quote_name(f.column) for f in fields],
            [f.get_db_prep_save(f.pre_save(obj, True), db) for f in fields])
