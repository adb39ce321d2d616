"""Server-side binding and prepared statements on PostgreSQL (config/settings.py).

The settings turn them on for PostgreSQL only when DB_SERVER_SIDE_BINDING=1 (off by default:
psycopg's Int4 wraps past 2**31 under server-side binding, shown below), and a hot read is
prepared on the connection once it has run DB_PREPARE_THRESHOLD times: the
planning PostgreSQL would otherwise repeat for every statement of the sweep and the paid paths."""

from __future__ import annotations

import os
import runpy
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

import config
from dunning.reads.cycles import cycle_read
from tests.support.builders import make_subscription, open_cycle

SETTINGS = Path(config.__file__).parent / "settings.py"  # read afresh, not the loaded module


def _database_options(monkeypatch: pytest.MonkeyPatch, **env: str) -> dict:
    for name in ("DB_SERVER_SIDE_BINDING", "DB_PREPARE_THRESHOLD"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return runpy.run_path(str(SETTINGS))["DATABASES"]["default"].get("OPTIONS", {})


def test_postgresql_binds_server_side_and_prepares_only_when_switched_on(monkeypatch):
    postgres = "postgres://postgres@127.0.0.1:5432/whatever"
    assert _database_options(monkeypatch, DATABASE_URL=postgres) == {}
    assert _database_options(monkeypatch, DATABASE_URL=postgres, DB_SERVER_SIDE_BINDING="1") == {
        "server_side_binding": True, "prepare_threshold": 5}
    assert _database_options(monkeypatch, DATABASE_URL=postgres, DB_SERVER_SIDE_BINDING="1",
                             DB_PREPARE_THRESHOLD="1") == {"server_side_binding": True, "prepare_threshold": 1}
    assert _database_options(monkeypatch, DATABASE_URL=postgres, DB_SERVER_SIDE_BINDING="0") == {}
    assert _database_options(monkeypatch, DATABASE_URL="sqlite:////tmp/prepared.sqlite3") == {}


def _prepared(fragment: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements WHERE statement LIKE %s",
                       [f"%{fragment}%"])
        return [row[0] for row in cursor.fetchall()]


@pytest.mark.django_db
def test_a_hot_read_is_prepared_once_it_has_run_threshold_times(policy):
    assert connection.vendor == "postgresql"
    on = _env_on()
    assert connection.features.uses_server_side_binding is on
    cycle = open_cycle(make_subscription())
    marker = "WHERE c.id = $1"  # cycle_read's own statement, as PostgreSQL keeps it (parameters apart)
    # psycopg prepares a statement on the execution after its prepare_threshold-th (0: at once).
    threshold = settings.DATABASES["default"]["OPTIONS"]["prepare_threshold"] if on else 5
    for _ in range(threshold):
        assert cycle_read(cycle.pk).pk == cycle.pk
    if threshold:
        assert _prepared(marker) == []  # one-off statements are not prepared
    for _ in range(2):
        assert cycle_read(cycle.pk).pk == cycle.pk
    statements = _prepared(marker)
    assert len(statements) == (1 if on else 0), statements  # prepared once, then reused


def _env_on() -> bool:
    return os.environ.get("DB_SERVER_SIDE_BINDING", "0").strip().lower() in {"1", "true", "yes", "on"}


@pytest.mark.django_db
def test_why_it_is_off_by_default_an_int4_past_32_bits_wraps_when_bound_server_side():
    """Django hands psycopg an Int4 for an int it types as IntegerField (`F(total) + amount`).
    Bound server-side, psycopg's binary dumper wraps it; written client-side it stays exact.
    If psycopg starts refusing or widening it, this fails: reconsider the default then."""
    from psycopg import ClientCursor, Cursor
    from psycopg.types.numeric import Int4

    connection.ensure_connection()
    raw = connection.connection
    with Cursor(raw) as server_side, ClientCursor(raw) as client_side:
        server_side.execute("SELECT %s::bigint", [Int4(10**12)])
        client_side.execute("SELECT %s::bigint", [Int4(10**12)])
        assert (server_side.fetchone()[0], client_side.fetchone()[0]) == (-727379968, 10**12)
