"""What a hand-written INSERT of a model instance needs from Django, shared by the one-statement
writers (dunning.acceptance.settlement_writes, agentpay.services.open_writes through agentpay.bridge):
the values Django's own INSERT would send, the statement sent as psycopg would send it, and the
instance marked saved afterwards."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper
from django.db.models import Field, Model
from psycopg import ClientCursor
from psycopg.adapt import Transformer


def mark_saved(db: BaseDatabaseWrapper, obj: Model, pk: int) -> None:
    """The instance as Django leaves it after its own INSERT returned `pk`."""
    obj.pk = pk
    obj._state.adding = False
    obj._state.db = db.alias


def insert_fields(model: type[Model], but: str = "") -> list[Field]:
    return [f for f in model._meta.local_concrete_fields if not f.primary_key and f.name != but]


def insert_params(db: BaseDatabaseWrapper, obj: Model, but: str = "") -> list[Any]:
    """The values Django's own INSERT of `obj` would send (defaults and `auto_now_add` applied,
    each field's conversion), without the primary key and the field named `but`."""
    return [f.get_db_prep_save(f.pre_save(obj, True), db) for f in insert_fields(type(obj), but)]


def execute_inlined(cursor: CursorWrapper, sql: str, params: Sequence[Any]) -> None:
    """`cursor.execute(sql, params)`, the same bytes sent, without psycopg parsing `sql` again.

    Django's PostgreSQL cursor binds client-side (psycopg's ClientCursor): each value is quoted as
    its SQL literal (`Transformer.as_literal`, NULL for None) into the statement's %s. psycopg
    caches the statement's split at its placeholders only up to 50 parameters, so a one-statement
    write of ~100 values is parsed by a regular expression on every execute (about 0.5 ms of a 402).
    `sql` holds no % but its %s placeholders, so it is its own template. A cursor binding on the
    server (`server_side_binding`) executes as usual."""
    _template(sql, "utf-8")  # refused on any backend, not only where it is the template
    raw = cursor.cursor
    if not isinstance(raw, ClientCursor):
        cursor.execute(sql, params)
        return
    tx = Transformer(raw)
    template = _template(sql, tx.encoding)
    cursor.execute(template % tuple(b"NULL" if p is None else tx.as_literal(p) for p in params))


@lru_cache(maxsize=32)
def _template(sql: str, encoding: str) -> bytes:
    if "%" in sql.replace("%s", ""):
        raise ValueError("a statement for execute_inlined holds no % but its %s placeholders")
    return sql.encode(encoding)
