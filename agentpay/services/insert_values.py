"""The values of a hand-written INSERT of a model instance (open_writes), converted as Django's
own INSERT converts them, without Django's per-value call chain where it changes nothing.

`dunning.acceptance.row_inserts.insert_params` runs `pre_save` then `get_db_prep_save` for every
field: for the ~100 values of an unpaid call's open (intent, settlement, fulfillment, challenge,
request row, two receipts, outbox) that chain was about a fifth of the 402's Python. Most of those
values are a str, None or an aware datetime, which Django's conversion for the plain field types
returns as they are: those are taken as they are here. Every other value (an int, which
PostgreSQL's psycopg 3 backend types by its column; JSON; bytes; a Decimal; a field class or
`pre_save` Django's plain types do not have) goes through Django's own chain, unchanged.
tests/agentpay_x402/test_insert_values.py compares both over the open's models.
"""

from __future__ import annotations

from datetime import datetime
from functools import cache
from typing import Any
from uuid import UUID

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import (
    BigIntegerField,
    BooleanField,
    CharField,
    DateTimeField,
    Field,
    ForeignKey,
    IntegerField,
    Model,
    OneToOneField,
    PositiveBigIntegerField,
    PositiveIntegerField,
    PositiveSmallIntegerField,
    SmallIntegerField,
    TextField,
    UUIDField,
)

from agentpay.bridge import insert_fields

# Exact classes (a subclass may convert differently), each with the value types Django's
# get_db_prep_save returns unchanged for it on PostgreSQL. None is unchanged for all of these
# (not for a JSONField: JSON null).
_AS_IS: dict[type[Field], tuple[type, ...]] = {
    CharField: (str,), TextField: (str,), DateTimeField: (), BooleanField: (bool,), UUIDField: (UUID,),
    ForeignKey: (), OneToOneField: (),
}
_INTEGERS = (IntegerField, BigIntegerField, SmallIntegerField, PositiveBigIntegerField, PositiveIntegerField,
             PositiveSmallIntegerField)

Plan = tuple[str, tuple[type, ...], bool, str]


def _plan(field: Field) -> Plan | None:
    """(attname, types kept as they are, aware datetimes kept, the internal type an int is adapted
    to or ''), or None: Django's own conversion for every value."""
    kind = type(field)
    if isinstance(field, DateTimeField) and (field.auto_now or field.auto_now_add):
        return None  # pre_save stamps it
    if kind in _INTEGERS:
        return field.attname, (), False, field.get_internal_type()
    if kind not in _AS_IS:
        return None
    return field.attname, _AS_IS[kind], kind is DateTimeField, ""


@cache
def _plans(model: type[Model], but: str) -> tuple[tuple[Field, Plan | None], ...]:
    return tuple((field, _plan(field)) for field in insert_fields(model, but))


def insert_values(db: BaseDatabaseWrapper, obj: Model, but: str = "") -> list[Any]:
    """The values Django's own INSERT of `obj` would send (as `insert_params`), without the
    primary key and the field named `but`."""
    out: list[Any] = []
    append = out.append
    state = obj.__dict__
    for field, plan in _plans(type(obj), but):
        if plan is not None:
            attname, kept, aware, integer = plan  # integer: the internal type, or ""

            value = state.get(attname, _MISSING)
            if value is None:
                append(None)
                continue
            kind = type(value)
            if kind in kept or (aware and kind is datetime and value.tzinfo is not None):
                append(value)
                continue
            if integer and kind is int:
                # What IntegerField.get_db_prep_value ends in: the column's psycopg type (Int8 for
                # a bigint), never a bare int that server-side binding would type Int4.
                append(db.ops.adapt_integerfield_value(value, integer))
                continue
        append(field.get_db_prep_save(field.pre_save(obj, True), db))
    return out


_MISSING = object()  # not in __dict__ (deferred): pre_save reads it as Django does
