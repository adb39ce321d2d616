import logging
import os
import sys
from collections.abc import Mapping

from celery import Celery
from celery.app.trace import LOG_RECEIVED, LOG_SUCCESS
from celery.signals import after_setup_logger, task_postrun, task_prerun, worker_process_init, worker_ready
from django.db import DEFAULT_DB_ALIAS, close_old_connections, connections

from config.startup_heap import freeze_startup_heap
from dunning.evidence.connection_health import health_check_without_round_trip

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("dunning")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# A task's database connections live as a request's do. Celery's Django fixup otherwise closes every
# connection before and after each task (celery/fixups/django.py, unless CELERY_DB_REUSE_MAX is set),
# so each paid event opened a new PostgreSQL connection: a backend forked, authenticated and its
# catalog caches warmed again, about 9 ms of PostgreSQL CPU per event beside the task's own 12. The
# fixup now never closes them (it reads the key under this name); Django's CONN_MAX_AGE does, and
# before and after each task a connection with errors or past its age is closed, as Django does
# around a request (close_old_connections), and a reused one is health-checked without a round trip.
app.conf.CELERY_DB_REUSE_MAX = sys.maxsize


@task_prerun.connect
def _connections_before_task(task=None, **_) -> None:  # noqa: ANN001
    if not _in_worker(task):
        return
    close_old_connections()
    health_check_without_round_trip(connections[DEFAULT_DB_ALIAS])


@task_postrun.connect
def _connections_after_task(task=None, **_) -> None:  # noqa: ANN001
    if _in_worker(task):
        close_old_connections()


@worker_ready.connect
def _freeze_heap_when_ready(**_) -> None:  # noqa: ANN003
    """The worker's own process (a threads or solo pool runs the tasks in it), its tasks imported."""
    freeze_startup_heap()


@worker_process_init.connect
def _freeze_heap_in_pool_process(**_) -> None:  # noqa: ANN003
    """A prefork pool's process, forked before the worker was ready (config/startup_heap.py)."""
    freeze_startup_heap()


def _in_worker(task) -> bool:  # noqa: ANN001
    """An eager task runs inside its caller, maybe inside its transaction: its connections are the caller's."""
    return task is not None and not getattr(task.request, "is_eager", False)


# The task every provider event runs (dunning.tasks.process_provider_event).
PROVIDER_EVENT_TASK = "dunning.tasks.process_provider_event"
# Celery's two INFO lines per task ("Received task", "Task ... succeeded"), by the loggers that write them.
PER_TASK_INFO_LOGGERS = ("celery.worker.strategy", "celery.app.trace")
# The Stripe SDK's logger: two INFO lines per API request ("Request to Stripe api", "Stripe API response").
STRIPE_SDK_LOGGER = "stripe"
# `WORKER_PER_EVENT_LOG=1` in a worker's environment keeps all four lines.
PER_EVENT_LOG_ENV = "WORKER_PER_EVENT_LOG"


class QuietProviderEventTasks(logging.Filter):
    """Drops the worker's "Received task" and "succeeded" INFO lines of the provider-event task.

    A worker run with `-l info` (README) wrote four INFO lines per paid event: these two, and the
    Stripe SDK's two for its one request (see `_quiet_per_event_lines`). Together about 0.7 ms of
    the worker's ~9 ms of CPU per event (records, formatting, writes; a threads worker on 400 paid
    events at -l info against -l warning), which a burst of 1,000 events pays on the same two cores
    that process them. What they say is kept per event in the inbox row
    (outcome, outcome_detail, processed_at, attempts, error) and the provider receipt of the fetch.
    Every other task's lines stay, and so do the event task's retries and failures."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        return not (record.msg in (LOG_RECEIVED, LOG_SUCCESS) and isinstance(args, Mapping)
                    and args.get("name") == PROVIDER_EVENT_TASK)


@after_setup_logger.connect
def _quiet_per_event_lines(**_) -> None:  # noqa: ANN003
    """After the worker set its log level (before its consumer reads it): the provider-event task's
    per-task lines are filtered out, and the Stripe SDK logs WARNING and above (its per-request INFO
    lines name only the URL and status; errors reach the adapter as exceptions and are recorded)."""
    if os.environ.get(PER_EVENT_LOG_ENV) == "1":
        return
    for name in PER_TASK_INFO_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, QuietProviderEventTasks) for f in logger.filters):
            logger.addFilter(QuietProviderEventTasks())
    stripe_logger = logging.getLogger(STRIPE_SDK_LOGGER)
    if stripe_logger.getEffectiveLevel() < logging.WARNING:
        stripe_logger.setLevel(logging.WARNING)


# Every job of SPEC §10 on the beat schedule; `manage.py run_jobs` runs the same jobs once.
from agentpay.schedule import beat_schedule as agentpay_beat_schedule  # noqa: E402
from dunning.jobs.schedule import beat_schedule  # noqa: E402

app.conf.beat_schedule = {**beat_schedule(), **agentpay_beat_schedule()}
