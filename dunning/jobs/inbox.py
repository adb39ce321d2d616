"""Inbox sweep: provider events nobody finished processing are processed again.

The webhook view hands events to Celery after commit; if the broker lost the task or the
worker died, the event stays PENDING in the inbox, and this sweep picks it up. Evidence is
never left waiting on a single delivery.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db.models import Q

from dunning.jobs.framework import JobReport, claim, due_in_order, scheduled_job
from dunning.models import EventOutcome, ProviderEvent
from dunning.services.event_processing import EventNotFinished, event_process

MAX_ATTEMPTS = 20


@scheduled_job("inbox_sweep", "process provider events still PENDING (or FAILED) after a minute")
def inbox_sweep(run: JobReport) -> None:
    stale = timedelta(seconds=getattr(settings, "DUNNING_INBOX_STALE_SECONDS", 60))
    waiting = ProviderEvent.objects.filter(
        Q(outcome=EventOutcome.PENDING) | Q(outcome=EventOutcome.FAILED), processed_at__isnull=True,
        received_at__lte=run.now - stale, attempts__lt=MAX_ATTEMPTS, signature_verified=True,
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
