import os
import sys

from celery import Celery
from celery.signals import task_postrun, task_prerun
from django.db import DEFAULT_DB_ALIAS, close_old_connections, connections

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


def _in_worker(task) -> bool:  # noqa: ANN001
    """An eager task runs inside its caller, maybe inside its transaction: its connections are the caller's."""
    return task is not None and not getattr(task.request, "is_eager", False)


# Every job of SPEC §10 on the beat schedule; `manage.py run_jobs` runs the same jobs once.
from agentpay.schedule import beat_schedule as agentpay_beat_schedule  # noqa: E402
from dunning.jobs.schedule import beat_schedule  # noqa: E402

app.conf.beat_schedule = {**beat_schedule(), **agentpay_beat_schedule()}
