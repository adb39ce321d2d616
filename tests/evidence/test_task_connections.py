"""A Celery task's database connection lives as a request's does (config/celery.py): Celery's Django
fixup closed every connection before and after each task, so each paid event opened a new
PostgreSQL connection. It is now kept between tasks, closed when it has errors or is past
CONN_MAX_AGE, and checked without a SELECT 1 round trip when its socket is quiet."""

from __future__ import annotations

import time

import pytest
from celery.fixups.django import DjangoWorkerFixup
from celery.signals import task_postrun, task_prerun
from django.db import connection

from config.celery import app as celery_app
from dunning.tasks import process_provider_event

pytestmark = pytest.mark.django_db(transaction=True)


def _task_runs(signal) -> None:  # noqa: ANN001
    """What a worker sends around a task (the task is not eager: its request is the default one)."""
    assert not process_provider_event.request.is_eager
    signal.send(sender=process_provider_event, task_id="t-1", task=process_provider_event, args=(1,), kwargs={})


def test_celerys_django_fixup_leaves_a_task_connection_open():
    connection.ensure_connection()
    backend = connection.connection.info.backend_pid
    fixup = DjangoWorkerFixup(celery_app)
    for _ in range(3):
        fixup.on_task_prerun(sender=process_provider_event)
        fixup.on_task_postrun(sender=process_provider_event)
    assert connection.connection is not None, "the fixup closed the connection after a task"
    assert connection.connection.info.backend_pid == backend


def test_a_connection_kept_between_tasks_is_not_asked_select_1(monkeypatch):
    connection.ensure_connection()
    backend = connection.connection.info.backend_pid
    _task_runs(task_postrun)
    assert not connection.health_check_done  # checked again before the next task's first query
    asked: list[bool] = []
    monkeypatch.setattr(connection, "is_usable", lambda: asked.append(True) or True)
    _task_runs(task_prerun)
    assert asked == [] and connection.health_check_done
    assert connection.connection.info.backend_pid == backend


def test_a_connection_past_its_age_is_closed_after_a_task():
    connection.ensure_connection()
    connection.close_at = time.monotonic() - 1  # CONN_MAX_AGE has run out
    _task_runs(task_postrun)
    assert connection.connection is None


def test_a_connection_with_errors_that_no_longer_answers_is_closed_before_a_task(monkeypatch):
    connection.ensure_connection()
    connection.errors_occurred = True
    monkeypatch.setattr(connection, "is_usable", lambda: False)
    _task_runs(task_prerun)
    assert connection.connection is None


def test_an_eager_task_leaves_its_callers_connection_alone():
    connection.ensure_connection()
    connection.close_at = time.monotonic() - 1
    process_provider_event.push_request(is_eager=True)
    try:
        task_postrun.send(sender=process_provider_event, task_id="t-2", task=process_provider_event, args=(1,),
                          kwargs={})
    finally:
        process_provider_event.pop_request()
    assert connection.connection is not None
