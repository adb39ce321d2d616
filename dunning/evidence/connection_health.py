"""A persistent PostgreSQL connection checked without a round trip, for the webhook intake (per
request) and the Celery worker (per task). No models: config.celery imports it as Django starts."""

from __future__ import annotations

import select

from django.db.backends.base.base import BaseDatabaseWrapper


def health_check_without_round_trip(db: BaseDatabaseWrapper) -> None:
    """Django's health check (CONN_HEALTH_CHECKS) asks a reused PostgreSQL connection SELECT 1 before
    the first query of each request: a round trip, and on a busy machine a wait for the scheduler,
    on every delivery. A connection the server has closed (a restart, a terminated backend, an idle
    timeout) has its FATAL notice or end of file waiting on the socket, where nothing else arrives
    while no query is in flight; psycopg knows one it has seen break. Such a connection, or one with
    anything to read, gets Django's own check; a quiet one is taken as healthy without asking, which
    is what Django's check would have found. Other databases (the SQLite demo) keep Django's."""
    raw = db.connection
    if raw is None or db.vendor != "postgresql" or not db.health_check_enabled or db.health_check_done:
        return
    if not (raw.closed or raw.broken) and not select.select([raw.pgconn.socket], [], [], 0)[0]:
        db.health_check_done = True
        return
    db.close_if_health_check_failed()
