"""config/celery.py: a worker at `-l info` no longer writes four INFO lines per provider event
(Celery's received/succeeded for the event task, the Stripe SDK's request/response), unless
WORKER_PER_EVENT_LOG=1; other tasks' lines, retries and failures are untouched."""

from __future__ import annotations

import logging

import pytest
from celery.app.trace import LOG_FAILURE, LOG_RECEIVED, LOG_RETRY, LOG_SUCCESS

from config import celery as worker_config


@pytest.fixture
def loggers():
    """The worker's loggers as they were, restored after the test."""
    names = (*worker_config.PER_TASK_INFO_LOGGERS, worker_config.STRIPE_SDK_LOGGER)
    saved = {n: (logging.getLogger(n).level, list(logging.getLogger(n).filters)) for n in names}
    yield {n: logging.getLogger(n) for n in names}
    for name, (level, filters) in saved.items():
        logger = logging.getLogger(name)
        logger.setLevel(level)
        logger.filters[:] = filters


def _kept(logger: logging.Logger, msg: str, task: str, level: int = logging.INFO) -> bool:
    record = logger.makeRecord(logger.name, level, __file__, 1, msg, ({"name": task, "id": "t-1"},), None)
    return bool(logger.filter(record))


def test_the_event_tasks_per_task_lines_and_the_sdks_request_lines_are_dropped(loggers, monkeypatch):
    monkeypatch.delenv(worker_config.PER_EVENT_LOG_ENV, raising=False)
    logging.getLogger(worker_config.STRIPE_SDK_LOGGER).setLevel(logging.NOTSET)
    worker_config._quiet_per_event_lines()
    worker_config._quiet_per_event_lines()  # once more (a second setup): one filter each
    strategy, trace = (loggers[n] for n in worker_config.PER_TASK_INFO_LOGGERS)
    event_task, other_task = worker_config.PROVIDER_EVENT_TASK, "dunning.tasks.run_scheduled_job"
    assert not _kept(strategy, LOG_RECEIVED, event_task)
    assert not _kept(trace, LOG_SUCCESS, event_task)
    assert _kept(strategy, LOG_RECEIVED, other_task) and _kept(trace, LOG_SUCCESS, other_task)
    assert _kept(trace, LOG_RETRY, event_task) and _kept(trace, LOG_FAILURE, event_task, logging.ERROR)
    assert sum(isinstance(f, worker_config.QuietProviderEventTasks) for f in trace.filters) == 1
    sdk = loggers[worker_config.STRIPE_SDK_LOGGER]
    assert not sdk.isEnabledFor(logging.INFO) and sdk.isEnabledFor(logging.WARNING)


def test_the_environment_keeps_every_line(loggers, monkeypatch):
    monkeypatch.setenv(worker_config.PER_EVENT_LOG_ENV, "1")
    sdk = loggers[worker_config.STRIPE_SDK_LOGGER]
    sdk.setLevel(logging.INFO)
    for name in worker_config.PER_TASK_INFO_LOGGERS:
        logging.getLogger(name).filters[:] = []
    worker_config._quiet_per_event_lines()
    assert _kept(loggers["celery.app.trace"], LOG_SUCCESS, worker_config.PROVIDER_EVENT_TASK)
    assert sdk.isEnabledFor(logging.INFO)
