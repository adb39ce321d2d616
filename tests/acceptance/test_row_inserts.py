"""execute_inlined (dunning/acceptance/row_inserts.py) sends the bytes psycopg's client-side binding
sends for the same statement and values, and refuses a statement it cannot take as its template."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
from django.db import connection
from psycopg.types.json import Jsonb

from dunning.acceptance.row_inserts import execute_inlined

pytestmark = pytest.mark.django_db

VALUES = [None, "it's 100% \\ plain", "", "ünïcode", b"\x00\x01'%s", datetime(2026, 12, 4, 3, 0, 1, 5, tzinfo=UTC),
          date(2026, 12, 4), Decimal("12.3400"), uuid.UUID("42c10afe-548f-4507-81c3-64605aad1c61"),
          Jsonb({"a": "%s", "b": [1, None, "x'y"]}), True, False, 0, -7, 12345678901234567, 1.5]
SQL = "SELECT " + ", ".join(["%s"] * len(VALUES))


def _sent(run) -> tuple[bytes, tuple]:
    with connection.cursor() as cursor:
        run(cursor)
        return cursor.cursor._query.query, cursor.fetchone()


def test_the_inlined_statement_is_the_one_psycopg_sends():
    bound = _sent(lambda cursor: cursor.execute(SQL, VALUES))
    inlined = _sent(lambda cursor: execute_inlined(cursor, SQL, VALUES))
    assert inlined == bound
    assert b"'it''s 100% " in inlined[0]  # the value quoted into the statement, its % left as it is


def test_a_statement_with_another_percent_is_refused():
    with connection.cursor() as cursor, pytest.raises(ValueError, match="placeholders"):
        execute_inlined(cursor, "SELECT %s, 'a%%b'", [1])
