"""Quarantine is not a grave: a billing lead can have a held provider event (QUARANTINED or
UNATTRIBUTABLE) fetched again and re-processed (issue 15, SPEC §8, §11).

The event goes through the very processing `event_process` runs (`event_process_fresh`): the
provider's objects are fetched again and the receipts decide; the event body is never evidence.
Only the bookkeeping differs, and that is the point of this module:

- A processed event is history. Its first verdict ("provider has no invoice in_…") explains why
  nothing happened to the customer at the time, so it must survive a later, different verdict.
  Each request therefore writes an append-only `EventReprocessing` row first — who, when, reason,
  ticket, and the outcome, detail and processing time the event held — committed before the
  provider is asked, so even a process killed halfway leaves the request on record.
- Then the normal processing runs (outside any transaction of ours: the acceptance service opens
  its own durable one), and the result is written to that row (new outcome and detail) and to the
  event's bookkeeping fields (outcome, detail, attribution, processed_at), together, in one
  transaction. The event row answers "what is this event now" cheaply for the admin list, the
  gates and the alerts job; the reprocessing rows answer "what was it before, and who changed it".
- One re-processing per event at a time: a partial unique index on the in-flight row. A row left
  STARTED by a process that died is marked ABANDONED after DUNNING_REPROCESS_STALE_SECONDS.
- The provider not answering decides nothing: the event keeps its outcome, the row says
  PROVIDER_UNAVAILABLE, and the lead may ask again.
"""

from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction

from dunning.clock import trusted_now
from dunning.evidence.processing import Processing, event_process_fresh
from dunning.models import EventOutcome, ProviderEvent
from dunning.models.inbox import EventReprocessing, ReprocessingStatus
from dunning.refusals import CodedRefusal
from subscriptions.providers.base import PaymentProvider, ProviderIndeterminate

log = logging.getLogger(__name__)

HELD_OUTCOMES = (EventOutcome.QUARANTINED, EventOutcome.UNATTRIBUTABLE)
DEFAULT_STALE_SECONDS = 600


class ReprocessRefused(CodedRefusal):
    """The request cannot be carried out; `detail` says why in plain words."""


@dataclass(frozen=True)
class ReprocessOutcome:
    attempt: EventReprocessing
    event: ProviderEvent

    @property
    def provider_answered(self) -> bool:
        return self.attempt.status == ReprocessingStatus.DONE

    @property
    def still_held(self) -> bool:
        return self.event.outcome in HELD_OUTCOMES

    def summary(self) -> str:
        """What happened, in words a support agent can act on."""
        attempt, event = self.attempt, self.event
        if not self.provider_answered:
            return (f"Nothing changed: the payment provider did not answer ({attempt.error}). Event {event.event_id} "
                    f"is still {event.outcome}; try again in a few minutes.")
        if self.still_held:
            return (f"Fetched again, still held: event {event.event_id} is {event.outcome} — "
                    f"{event.outcome_detail or 'no detail'}.")
        where = f" for subscription {event.subscription.provider_subscription_id}" if event.subscription else ""
        return (f"Re-processed event {event.event_id}{where}: {attempt.previous_outcome} → {event.outcome}"
                f"{' — ' + event.outcome_detail if event.outcome_detail else ''}.")


def _stale_after() -> timedelta:
    return timedelta(seconds=float(getattr(settings, "DUNNING_REPROCESS_STALE_SECONDS", DEFAULT_STALE_SECONDS)))


def _retention_text() -> str:
    return f"{getattr(settings, 'RAW_BODY_RETENTION_DAYS', '?')} days"


def _not_held_text(event: ProviderEvent) -> str:
    when = f" on {event.processed_at:%Y-%m-%d %H:%M} UTC" if event.processed_at else ""
    if event.outcome in (EventOutcome.PENDING, EventOutcome.FAILED):
        return (f"Event {event.event_id} is not held: it is {event.outcome} and is still being processed "
                f"automatically (the inbox sweep retries it). Only quarantined or unattributable events can be "
                f"fetched again by hand.")
    return (f"Event {event.event_id} is not held: it was processed{when} as {event.outcome}. Only quarantined or "
            f"unattributable events can be fetched again and re-processed.")


def _claim(event_pk: int, user: Any, reason: str, ticket: str, now: datetime) -> EventReprocessing:
    with transaction.atomic():
        event = ProviderEvent.objects.select_for_update().get(pk=event_pk)
        if event.body_purged_at is not None:  # its body names what to fetch; only its ids are left
            raise ReprocessRefused(
                "RAW_BODY_PURGED",
                f"Event {event.event_id} cannot be re-processed: its raw body was purged on "
                f"{event.body_purged_at:%Y-%m-%d} (kept {_retention_text()}); its receipts, facts and "
                f"digests are still on record.")
        if event.outcome not in HELD_OUTCOMES:
            raise ReprocessRefused("NOT_HELD", _not_held_text(event))
        running = EventReprocessing.objects.filter(event=event, status=ReprocessingStatus.STARTED).first()
        if running is not None:
            if running.requested_at > now - _stale_after():
                raise ReprocessRefused(
                    "REPROCESSING_IN_PROGRESS",
                    f"{running.actor} started re-processing event {event.event_id} at "
                    f"{running.requested_at:%H:%M:%S} UTC; wait for it to finish, then look at the event again.")
            running.status, running.finished_at = ReprocessingStatus.ABANDONED, now
            running.error = "the process that started it stopped before recording a result"
            running.save(update_fields=["status", "finished_at", "error"])
        try:
            with transaction.atomic():
                return EventReprocessing.objects.create(
                    event=event, requested_by=user, actor=user.get_username()[:150], reason=reason, ticket=ticket,
                    requested_at=now, previous_outcome=event.outcome, previous_detail=event.outcome_detail,
                    previous_processed_at=event.processed_at,
                )
        except IntegrityError:  # the row lock makes this unreachable; the index is the last word
            raise ReprocessRefused("REPROCESSING_IN_PROGRESS",
                                   f"Event {event.event_id} is being re-processed right now.") from None


def _finish(attempt: EventReprocessing, result: Processing | None, status: str, error: str,
            now: datetime) -> ProviderEvent:
    with transaction.atomic():
        event = ProviderEvent.objects.select_for_update().get(pk=attempt.event_id)
        fields = ["attempts"]
        event.attempts += 1
        if result is not None:
            event.outcome = result.outcome
            event.outcome_detail = "; ".join(result.detail)[:4000]
            event.subscription, event.invoice, event.cycle = result.subscription, result.invoice, result.cycle
            event.processed_at = now
            event.error = ""
            fields += ["outcome", "outcome_detail", "subscription", "invoice", "cycle", "processed_at", "error"]
        event.save(update_fields=fields)
        attempt.status, attempt.finished_at, attempt.error = status, trusted_now(), error[-4000:]
        if result is not None:
            attempt.new_outcome, attempt.new_detail = event.outcome, event.outcome_detail
        attempt.save(update_fields=["status", "finished_at", "error", "new_outcome", "new_detail"])
    return ProviderEvent.objects.select_related("subscription", "invoice", "cycle").get(pk=event.pk)


def event_reprocess(*, event_pk: int, user: Any, reason: str, ticket: str, now: datetime | None = None,
                    provider: PaymentProvider | None = None) -> ReprocessOutcome:
    """Fetch the held event's objects from the provider again and process it the normal way.

    Raises ReprocessRefused (reason or ticket missing, event not held, already running). Returns
    the audit row and the event as it is now; `provider_answered` is False when the provider
    could not be asked (nothing changed then). An unexpected error is recorded on the audit row
    (FAILED) and raised; the event keeps its outcome.
    """
    reason, ticket = (reason or "").strip(), (ticket or "").strip()
    if not reason or not ticket:
        raise ReprocessRefused("REASON_AND_TICKET_REQUIRED", "Re-processing an event needs a reason and a ticket.")
    now = now or trusted_now()
    attempt = _claim(event_pk, user, reason, ticket, now)
    event = ProviderEvent.objects.get(pk=event_pk)
    log.info("event %s: re-processing requested by %s (%s), was %s", event.event_id, attempt.actor, ticket,
             attempt.previous_outcome)
    try:
        result = event_process_fresh(event, now=now, provider=provider)
    except ProviderIndeterminate as exc:
        event = _finish(attempt, None, ReprocessingStatus.PROVIDER_UNAVAILABLE, str(exc), now)
        return ReprocessOutcome(attempt, event)
    except Exception:
        log.exception("event %s: re-processing failed", event.event_id)
        _finish(attempt, None, ReprocessingStatus.FAILED, traceback.format_exc(), now)
        raise
    event = _finish(attempt, result, ReprocessingStatus.DONE, "", now)
    log.info("event %s: re-processed by %s: %s → %s", event.event_id, attempt.actor, attempt.previous_outcome,
             event.outcome)
    return ReprocessOutcome(attempt, event)
