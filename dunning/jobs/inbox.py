"""Inbox sweep: provider events nobody finished processing are processed again.

The webhook view hands events to Celery after commit. A worker processes an event holding the
event's claim (a PostgreSQL session advisory lock, `claim("event", pk)`), so a live worker's
event is never taken from it; the lock dies with the worker's database connection, so a worker
killed mid-task (`kill -9`, OOM) leaves its event unclaimed at once. The broker would hand such a
task out again only after its visibility timeout (an hour on Redis), and a lost hand-off (broker
down) never at all; the sweep does not wait for either:

- an event that never finished an attempt is orphaned once it is older than
  DUNNING_INBOX_ORPHAN_SECONDS (a few seconds) and nobody holds its claim;
- an event that did finish an attempt (FAILED, or retrying with back-off after the provider did
  not answer) is taken after DUNNING_INBOX_STALE_SECONDS, as before, so the sweep does not undercut
  the task's back-off.

Taking an event whose task is only queued behind a burst is harmless: the claim and the
processed_at check make sure one of the two processes it and the other finds it done. Evidence is
never left waiting on a single delivery.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db.models import Q

from dunning.claims import claim
from dunning.evidence.processing import EventNotFinished, event_process
from dunning.jobs.framework import JobReport, due_in_order, scheduled_job
from dunning.models import EventOutcome, ProviderEvent

MAX_ATTEMPTS = 20


@scheduled_job("inbox_sweep", "process provider events orphaned by a lost task or a dead worker (seconds), "
                              "or still PENDING / FAILED a minute after an attempt")
def inbox_sweep(run: JobReport) -> None:
    stale = timedelta(seconds=getattr(settings, "DUNNING_INBOX_STALE_SECONDS", 60))
    orphaned = timedelta(seconds=getattr(settings, "DUNNING_INBOX_ORPHAN_SECONDS", 5))
    waiting = ProviderEvent.objects.filter(
        Q(outcome=EventOutcome.PENDING, attempts=0, received_at__lte=run.now - orphaned)
        | Q(outcome__in=(EventOutcome.PENDING, EventOutcome.FAILED), received_at__lte=run.now - stale),
        processed_at__isnull=True, attempts__lt=MAX_ATTEMPTS, signature_verified=True,
    )
    for pk in due_in_order(waiting, "received_at"):
        run.examined += 1
        run.tick()
        with claim("event", pk) as got:
            if not got:
                continue
            try:
                outcome = event_process(event_pk=pk, now=run.now)
            except EventNotFinished as exc:
                run.errors += 1
                run.note(f"event {pk}: provider did not answer: {exc}")
                continue
            except Exception as exc:  # recorded on the event by event_process
                run.errors += 1
                run.note(f"event {pk}: {type(exc).__name__}: {exc}")
                continue
            run.changed += 1
            run.note(f"event {pk}: {outcome}")
