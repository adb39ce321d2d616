"""Celery tasks: thin wrappers that load ids and call services."""

from __future__ import annotations

from celery import shared_task

from dunning.services.event_processing import EventNotFinished, event_process


@shared_task(bind=True, autoretry_for=(EventNotFinished,), retry_backoff=5, retry_backoff_max=600, max_retries=20,
             acks_late=True)
def process_provider_event(self, event_pk: int) -> str:  # noqa: ANN001
    return event_process(event_pk=event_pk)


@shared_task(acks_late=True, ignore_result=True)
def run_scheduled_job(name: str) -> str:
    """Beat entry point: one run of one job for the trusted now, recorded as a JobRun."""
    from dunning.jobs.framework import job_run

    return job_run(name).status
