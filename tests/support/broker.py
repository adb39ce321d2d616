"""Tasks handed to a real broker from the test process, as the web process hands them (the suite
otherwise runs them in process, tests/conftest.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import kombu.pools

from config.celery import app as celery_app


@contextlib.contextmanager
def tasks_through(broker_url: str) -> Iterator[None]:
    conf = celery_app.conf
    saved = conf.task_always_eager, conf.broker_url
    conf.task_always_eager, conf.broker_url = False, broker_url
    celery_app._pool = celery_app.amqp._producer_pool = None  # producer pools are built from broker_url once
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            celery_app.pool.force_close_all()
        # kombu keeps producer pools per connection in a registry of its own; a closed one found
        # there again makes the next switch fail with "Acquire on closed pool".
        kombu.pools.reset()
        celery_app._pool = celery_app.amqp._producer_pool = None
        conf.task_always_eager, conf.broker_url = saved
