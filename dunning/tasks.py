"""Celery tasks: thin wrappers that load ids and call services."""

from __future__ import annotations

from celery import shared_task
from django.contrib.auth import get_user_model

from dunning.actions.alert_delivery import alert_message_handle
from dunning.claims import claim
from dunning.evidence.processing import EventNotFinished, event_process
from dunning.jobs.framework import job_run
from dunning.rollout.rebinding import rollout_rebind_forward

# A task that finds its event claimed by another process (the inbox sweep, or a redelivered copy
# of itself) asks again after this long; by then the event is usually done and the task returns.
EVENT_BUSY_RETRY_SECONDS = 5


@shared_task(bind=True, autoretry_for=(EventNotFinished,), retry_backoff=5, retry_backoff_max=600, max_retries=20,
             acks_late=True)
def process_provider_event(self, event_pk: int) -> str:  # noqa: ANN001
    """Process one inbox event while holding its claim (dunning/jobs/inbox.py): the claim tells the
    inbox sweep the event is in flight on a live worker, and dies with this worker's connection."""
    with claim("event", event_pk) as got:
        if got:
            return event_process(event_pk=event_pk)
    if self.request.is_eager:
        return "IN_FLIGHT"  # in process there is no broker to ask again; the holder finishes it
    raise self.retry(countdown=EVENT_BUSY_RETRY_SECONDS)


@shared_task(acks_late=True, ignore_result=True)
def run_scheduled_job(name: str) -> str:
    """Beat entry point: one run of one job for the trusted now, recorded as a JobRun."""
    return job_run(name).status


@shared_task(acks_late=True, ignore_result=True)
def deliver_alert(message_pk: int) -> str:
    """After commit of a new alert episode: email and webhook it (dunning.actions.alert_delivery)."""
    return str(alert_message_handle(message_pk=message_pk))


@shared_task(acks_late=False, ignore_result=True)
def rebind_cohort_forward(*, cohort: str, policy_pk: int, user_pk: int, reason: str, ticket: str,
                          batch: int = 500) -> str:
    """A forward rebind queued from the rollout page (dunning.rollout.rebinding). Not acked late: a
    redelivery after a crash would be a second run, which is safe (it visits only subscriptions
    still on older versions) but should be a person's decision, from the page or the CLI."""
    user = get_user_model().objects.get(pk=user_pk)
    run = rollout_rebind_forward(cohort=cohort, to_policy=policy_pk, by=user, reason=reason, ticket=ticket,
                                 batch=batch)
    return run.status
