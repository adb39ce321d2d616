"""Server-side binding and prepared statements on PostgreSQL (config/settings.py).

The settings turn them on for PostgreSQL unless DB_SERVER_SIDE_BINDING=0, and a hot read is
prepared on the connection once it has run DB_PREPARE_THRESHOLD times: the planning PostgreSQL
would otherwise repeat for every statement of the sweep and the paid paths. An integer Django typed
narrower than its value arrives exact or is refused, never wrapped (dunning/psycopg_ints.py)."""

from __future__ import annotations

import os
import runpy
from pathlib import Path

import pytest
from django.conf import settings
from django.db import DataError, connection, transaction
from psycopg import ClientCursor, Cursor
from psycopg.types.numeric import Int2, Int4, Int8

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


def test_postgresql_binds_server_side_and_prepares_unless_switched_off(monkeypatch):
    postgres = "postgres://postgres@127.0.0.1:5432/whatever"
    assert _database_options(monkeypatch, DATABASE_URL=postgres) == {
        "server_side_binding": True, "prepare_threshold": 5}
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
    return os.environ.get("DB_SERVER_SIDE_BINDING", "1").strip().lower() in {"1", "true", "yes", "on"}


@pytest.mark.django_db
def test_an_int_wider_than_its_declared_width_arrives_exact_or_is_refused_never_wrapped():
    """Django hands psycopg an Int4 for an int it types as IntegerField (`F(total) + amount`).
    psycopg's own binary dumper would wrap it past 2**31 (10**12 -> -727379968); ours widens it."""
    connection.ensure_connection()
    raw = connection.connection
    with Cursor(raw) as server_side, ClientCursor(raw) as client_side:
        for cursor in (server_side, client_side):
            cursor.execute("SELECT %s::numeric, %s::numeric, %s::numeric, %s::numeric, %s::numeric",
                           [Int4(10**12), Int2(70_000), Int8(10**20), Int4(-(2**31) - 1), Int4(7)])
            assert cursor.fetchone() == (10**12, 70_000, 10**20, -(2**31) - 1, 7)
        server_side.execute("SELECT pg_typeof(%s)::text, pg_typeof(%s)::text", [Int4(7), Int4(2**31)])
        assert server_side.fetchone() == ("integer", "bigint")  # the declared width when it fits
        # A real Int8 after an Int4 was widened to int8 is still range checked (psycopg caches the
        # widened dumper; it must not be the one a real Int8 gets).
        server_side.execute("SELECT %s::numeric, %s::numeric", [Int4(2**40), Int8(2**70)])
        assert server_side.fetchone() == (2**40, 2**70)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("CREATE TEMP TABLE widths (narrow integer, wide bigint) ON COMMIT DROP")
        cursor.execute("INSERT INTO widths VALUES (%s, %s)", [Int4(1), Int4(10**12)])
        cursor.execute("SELECT narrow, wide FROM widths")
        assert cursor.fetchone() == (1, 10**12)
        with pytest.raises(DataError), transaction.atomic():
            cursor.execute("INSERT INTO widths VALUES (%s, %s)", [Int4(10**12), Int4(1)])
