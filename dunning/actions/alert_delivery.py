"""Alerts reach a person (issue 19 item 2): an email to the on-call list and a signed webhook.

1. `alert_delivery_request` runs inside the transaction that stores a new alert episode
   (`dunning.actions.alerts.alert_raise`): it writes one `alert.raised` outbox row and, on commit
   only, hands the row to a worker task. A rolled-back raise leaves nothing to send; a re-raise
   of the open episode writes nothing (only a new episode does).
2. `alert_message_deliver` (the task, or the outbox relay when the hand-off was lost) creates one
   AlertDelivery per channel — unique per (episode, channel), which is the deduplication — and
   tries each once. Sends happen outside any transaction, under a per-delivery claim.
3. A failed try is recorded (status code, error) and tried again by the `alert_deliveries` job
   after 30 s, 60 s, 120 s … (ALERT_DELIVERY_BACKOFF_*), ALERT_DELIVERY_MAX_ATTEMPTS tries in all,
   then FAILED. An HTTP 4xx other than 408/429 will not change on a retry and fails at once.
   A try a dead worker left SENDING counts as a try (it may have gone out) and is recorded so.

An episode resolved before it was sent is not sent any more (SKIPPED, saying who resolved it).
"""

from __future__ import annotations

import logging
import urllib.error
import urllib.request
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.mail import EmailMessage
from django.db import transaction

from dunning.actions.alert_messages import alert_email, alert_webhook_body, alert_webhook_headers
from dunning.claims import claim
from dunning.clock import trusted_now
from dunning.handoff import TaskHandoff
from dunning.models import (
    ALERT_RAISED_TOPIC,
    Alert,
    AlertChannel,
    AlertDelivery,
    AlertDeliveryAttempt,
    AlertDeliveryStatus,
    OutboxMessage,
)

log = logging.getLogger(__name__)
S = AlertDeliveryStatus
OPEN_STATUSES = (S.PENDING, S.RETRYING, S.SENDING)
RETRYABLE_CLIENT_ERRORS = frozenset({408, 425, 429})


# The Celery task (dunning.tasks.deliver_alert), named by DunningConfig.ready. The outbox row is
# already safe: when the broker is down the outbox relay delivers it on its next run instead.
ALERT_HANDOFF = TaskHandoff("alert message", "the outbox relay will send it")
alert_delivery_worker_set = ALERT_HANDOFF.set


def _enqueue(message_pk: int) -> None:
    ALERT_HANDOFF.enqueue(message_pk)


def alert_delivery_request(*, alert: Alert, now: datetime) -> OutboxMessage:
    """Inside the transaction that stored the new episode `alert`: the outbox row that will
    announce it, handed to a worker only once that transaction commits."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("alert_delivery_request must run in the transaction that stores the alert")
    message = OutboxMessage.objects.create(
        topic=ALERT_RAISED_TOPIC, dedupe_key=f"{ALERT_RAISED_TOPIC}:{alert.pk}", subscription=alert.subscription,
        created_at=now, payload={"alert": alert.pk, "dedupe_key": alert.dedupe_key, "kind": alert.kind},
    )
    transaction.on_commit(lambda: _enqueue(message.pk))
    return message


def _webhook_target(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}/…" if parts.path not in ("", "/") else f"{parts.scheme}://{parts.netloc}"


def _planned(alert: Alert, message: OutboxMessage, now: datetime) -> list[AlertDelivery]:
    """One row per channel; a channel that is not configured is recorded as not sent, and why."""
    emails = list(getattr(settings, "ALERT_ONCALL_EMAILS", []) or [])
    url = str(getattr(settings, "ALERT_WEBHOOK_URL", "") or "")
    secret = str(getattr(settings, "ALERT_WEBHOOK_SECRET", "") or "")
    # Due from the moment the alert was announced, whoever plans it: a second worker planning with
    # its own, later `now` must not make the first one's try look early (it would skip it as NOT_DUE
    # while the second found it BUSY, and the first try would wait for the retry job).
    due = min(now, message.created_at)
    email = AlertDelivery(alert=alert, channel=AlertChannel.EMAIL, message=message, created_at=now,
                          target=", ".join(emails), next_attempt_at=due)
    if not emails:
        email.status, email.next_attempt_at, email.last_error = S.SKIPPED, None, "ALERT_ONCALL_EMAILS is empty"
    webhook = AlertDelivery(alert=alert, channel=AlertChannel.WEBHOOK, message=message, created_at=now,
                            target=_webhook_target(url) if url else "", next_attempt_at=due)
    if not url:
        webhook.status, webhook.next_attempt_at, webhook.last_error = S.SKIPPED, None, "ALERT_WEBHOOK_URL is not set"
    elif not secret:
        webhook.status, webhook.next_attempt_at = S.FAILED, None
        webhook.last_error = "ALERT_WEBHOOK_SECRET is empty: an unsigned alert webhook is never sent"
    return [email, webhook]


def alert_message_deliver(message: OutboxMessage, *, now: datetime) -> dict[str, int]:
    """Plan the episode's deliveries (once per channel, whoever calls) and try each open one once.
    Send failures are recorded on the deliveries, not raised: their retries are bounded there."""
    alert = Alert.objects.select_related("subscription", "invoice").get(pk=message.payload["alert"])
    AlertDelivery.objects.bulk_create(_planned(alert, message, now), ignore_conflicts=True)
    counts: dict[str, int] = {}
    for pk in AlertDelivery.objects.filter(alert=alert, status=S.PENDING).order_by("pk").values_list("pk", flat=True):
        outcome = alert_delivery_attempt(delivery_pk=pk, now=now)
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts


def alert_message_handle(*, message_pk: int, now: datetime | None = None) -> dict[str, int]:
    """The worker task's service: deliver the message and mark it published (the relay then
    leaves it alone)."""
    now = now or trusted_now()
    message = OutboxMessage.objects.get(pk=message_pk, topic=ALERT_RAISED_TOPIC)
    counts = alert_message_deliver(message, now=now)
    OutboxMessage.objects.filter(pk=message.pk, published_at__isnull=True).update(published_at=now, last_error="")
    return counts


def delivery_backoff(attempts: int) -> timedelta:
    base = int(getattr(settings, "ALERT_DELIVERY_BACKOFF_BASE_SECONDS", 30))
    cap = int(getattr(settings, "ALERT_DELIVERY_BACKOFF_MAX_SECONDS", 1800))
    return timedelta(seconds=min(base * 2 ** max(attempts - 1, 0), cap))


def _max_attempts() -> int:
    return max(int(getattr(settings, "ALERT_DELIVERY_MAX_ATTEMPTS", 5)), 1)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a redirect is answered as the 3xx it is: not delivered


_opener = urllib.request.build_opener(_NoRedirect)


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int | None, str]:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    timeout = float(getattr(settings, "ALERT_WEBHOOK_TIMEOUT_SECONDS", 5))
    try:
        with _opener.open(request, timeout=timeout) as response:
            return response.status, ""
    except urllib.error.HTTPError as exc:
        return exc.code, f"HTTP {exc.code} {exc.reason}"[:2000]
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return None, f"{type(exc).__name__}: {exc}"[:2000]


def _send(delivery: AlertDelivery) -> tuple[bool, bool, int | None, str]:
    """(sent, worth retrying, HTTP status, error) of one try."""
    alert = delivery.alert
    if delivery.channel == AlertChannel.EMAIL:
        subject, body = alert_email(alert)
        recipients = [a.strip() for a in delivery.target.split(",") if a.strip()]
        email = EmailMessage(subject=subject, body=body, to=recipients,
                             from_email=getattr(settings, "DEFAULT_FROM_EMAIL", None),
                             headers={"X-Dunning-Alert": alert.dedupe_key})
        try:
            email.send(fail_silently=False)
        except Exception as exc:  # any backend's failure: SMTP, a refused recipient, a timeout
            return False, True, None, f"{type(exc).__name__}: {exc}"[:2000]
        return True, False, None, ""
    body = alert_webhook_body(alert)
    headers = alert_webhook_headers(message_key=delivery.message.dedupe_key, secret=settings.ALERT_WEBHOOK_SECRET,
                                    body=body, sent_at=trusted_now())
    status, error = _post(settings.ALERT_WEBHOOK_URL, body, headers)
    if status is not None and 200 <= status < 300:
        return True, False, status, ""
    permanent = status is not None and 400 <= status < 500 and status not in RETRYABLE_CLIENT_ERRORS
    return False, not permanent, status, error or f"HTTP {status}"


def _record_try(delivery: AlertDelivery, number: int, started: datetime, outcome: str, status_code: int | None,
                error: str) -> None:
    AlertDeliveryAttempt.objects.create(delivery=delivery, number=number, started_at=started,
                                        finished_at=max(started, trusted_now()), outcome=outcome,
                                        status_code=status_code, error=error)


def _interrupted(delivery: AlertDelivery, now: datetime) -> bool:
    """A SENDING row whose claim was free: its worker died mid-try. Recorded as a try; True when
    that was the last one allowed (the delivery is then FAILED)."""
    error = "the worker stopped during this try; it may or may not have gone out"
    last = delivery.attempts >= _max_attempts()
    _record_try(delivery, delivery.attempts, delivery.last_attempt_at or now, "FAILED" if last else "RETRY", None,
                error)
    AlertDelivery.objects.filter(pk=delivery.pk, status=S.SENDING).update(
        status=S.FAILED if last else S.RETRYING, last_error=error, next_attempt_at=None if last else now)
    return last


def alert_delivery_attempt(*, delivery_pk: int, now: datetime) -> str:
    """Try one delivery once when it is due and no other worker holds it. Returns SENT, RETRY,
    FAILED, SKIPPED (resolved before it went out), BUSY or NOT_DUE. Makes a network call: never
    inside a transaction."""
    with claim("alert_delivery", delivery_pk) as got:
        if not got:
            return "BUSY"
        delivery = (AlertDelivery.objects.select_related("alert", "alert__subscription", "alert__invoice", "message")
                    .filter(pk=delivery_pk, status__in=OPEN_STATUSES).first())
        if delivery is None or (delivery.next_attempt_at is not None and delivery.next_attempt_at > now):
            return "NOT_DUE"
        if delivery.status == S.SENDING and _interrupted(delivery, now):
            return "FAILED"
        alert = delivery.alert
        if alert.resolved_at is not None:
            why = f"resolved by {alert.resolved_by} at {alert.resolved_at:%Y-%m-%d %H:%M} UTC before it went out"
            AlertDelivery.objects.filter(pk=delivery.pk).update(status=S.SKIPPED, next_attempt_at=None, last_error=why)
            return "SKIPPED"
        number = delivery.attempts + 1  # an interrupted try was counted when it began
        # Counted before the send: a try a crash interrupts still counts against the bound.
        AlertDelivery.objects.filter(pk=delivery.pk).update(status=S.SENDING, attempts=number, last_attempt_at=now)
        sent, retry, status_code, error = _send(delivery)
        fields: dict[str, Any] = {"last_status_code": status_code, "last_error": error}
        if sent:
            outcome = "SENT"
            fields.update(status=S.SENT, sent_at=now, next_attempt_at=None)
        elif retry and number < _max_attempts():
            outcome = "RETRY"
            fields.update(status=S.RETRYING, next_attempt_at=now + delivery_backoff(number))
        else:
            outcome = "FAILED"
            fields.update(status=S.FAILED, next_attempt_at=None)
        _record_try(delivery, number, now, outcome, status_code, error)
        AlertDelivery.objects.filter(pk=delivery.pk, status=S.SENDING).update(**fields)
        log.log(logging.INFO if sent else logging.WARNING, "alert %s via %s: %s (try %d) %s", alert.dedupe_key,
                delivery.channel, outcome, number, error)
        return outcome


def due_alert_deliveries(now: datetime):  # noqa: ANN201 - an AlertDelivery queryset
    """Deliveries the retry job tries: open and due (a SENDING one only if its worker is gone,
    which the claim tells)."""
    return AlertDelivery.objects.filter(status__in=OPEN_STATUSES, next_attempt_at__lte=now)
