"""Retention of raw provider bodies (issue 19 item 3, seed 003): after RAW_BODY_RETENTION_DAYS the
stored bodies of finished webhook deliveries, inbox events and receipts are emptied.

What stays is everything a decision or an audit reads: the rows themselves, their digests
(`body_sha256`, `body_digest`), statuses, amounts, currencies, links, the money facts and the
transition receipts. A purged event keeps its ids (`ProviderEvent.purged_raw_body`), because
the gates and alerts find events by the object they name.

Never purged, whatever their age (they may still be read or acted on):
- an event still PENDING or FAILED (the inbox sweep processes it), or held QUARANTINED or
  UNATTRIBUTABLE (a billing lead may re-process it), with its deliveries and receipts;
- a delivery whose verdict is still PENDING (it failed on our side and was never judged);
- a receipt of an invoice whose cycle is in EVIDENCE_CONFLICT (a billing lead decides on it).

Each table is swept in pk batches, one UPDATE per batch through the narrow append-only exception
(`AppendOnlyQuerySet.purge_raw_body`); a purged row is never selected again, so a re-run, or a run
stopped halfway and started again, purges only what is left.
"""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Q, QuerySet

from dunning.jobs.framework import JobReport, ahead_of_the_clock, job_setting, scheduled_job
from dunning.models import EventOutcome, ProviderEvent, ProviderReceipt, Verification, WebhookDelivery
from dunning.models.inbox import EventReprocessing, ReprocessingStatus
from dunning.state_names import EVIDENCE_CONFLICT

DEFAULT_RETENTION_DAYS = 90
DEFAULT_BATCH = 500
# Events whose body may still be needed: being processed, or held for a person.
KEPT_OUTCOMES = (EventOutcome.PENDING, EventOutcome.FAILED, EventOutcome.QUARANTINED, EventOutcome.UNATTRIBUTABLE)


def _retention_days() -> int:
    days = int(job_setting("RAW_BODY_RETENTION_DAYS", DEFAULT_RETENTION_DAYS))
    if days < 1:
        raise ValueError(f"RAW_BODY_RETENTION_DAYS must be at least 1 day, not {days}")
    return days


def _event_kept(prefix: str = "") -> Q:
    """Events (or rows linked to one through `prefix`) whose body must stay."""
    reprocessing = EventReprocessing.objects.filter(status=ReprocessingStatus.STARTED).values("event_id")
    return (Q(**{f"{prefix}processed_at__isnull": True}) | Q(**{f"{prefix}outcome__in": KEPT_OUTCOMES})
            | Q(**{f"{prefix}pk__in": reprocessing}))


def purgeable_events(cutoff) -> QuerySet:  # noqa: ANN001
    return ProviderEvent.objects.filter(received_at__lt=cutoff, body_purged_at__isnull=True).exclude(_event_kept())


def purgeable_deliveries(cutoff) -> QuerySet:  # noqa: ANN001
    finished = Q(verification=Verification.REJECTED) | (
        Q(verification=Verification.VERIFIED, event__isnull=False) & ~_event_kept("event__"))
    return WebhookDelivery.objects.filter(finished, received_at__lt=cutoff, body_purged_at__isnull=True)


def purgeable_receipts(cutoff) -> QuerySet:  # noqa: ANN001
    return (ProviderReceipt.objects.filter(fetched_at__lt=cutoff, body_purged_at__isnull=True)
            .exclude(Q(cause_event__isnull=False) & _event_kept("cause_event__"))
            .exclude(invoice__cycle__state=EVIDENCE_CONFLICT))


def _purge(run: JobReport, label: str, eligible: QuerySet, batch: int) -> None:
    model = eligible.model
    purged, last = 0, 0
    while True:
        page = list(eligible.filter(pk__gt=last).order_by("pk").values_list("pk", flat=True)[:batch])
        if not page:
            break
        last = page[-1]
        done = model.objects.filter(pk__in=page).purge_raw_body(now=run.now)
        run.examined += len(page)
        run.changed += done
        purged += done
        if run.progress:
            run.progress(f"{run.job}: {label}: {purged} purged so far (up to pk {last})")
    run.note(f"{label}: {purged} purged")


@scheduled_job("purge_raw_bodies", "empty the stored bodies of finished provider deliveries, events and receipts "
                                   "older than RAW_BODY_RETENTION_DAYS (digests, facts and receipts stay)")
def purge_raw_bodies(run: JobReport) -> None:
    if ahead_of_the_clock(run):  # a `now` ahead of the clock would purge bodies before their time
        return
    cutoff = run.now - timedelta(days=_retention_days())
    batch = int(job_setting("RAW_BODY_PURGE_BATCH", DEFAULT_BATCH))
    run.note(f"purging bodies received or fetched before {cutoff.isoformat()}")
    # Receipts and deliveries before their events: each is judged by its event, which stays
    # unpurged until its own turn, so a run stopped in between leaves nothing inconsistent.
    _purge(run, "webhook deliveries", purgeable_deliveries(cutoff), batch)
    _purge(run, "provider receipts", purgeable_receipts(cutoff), batch)
    _purge(run, "provider events", purgeable_events(cutoff), batch)
