"""An event's outcome, written once its processing has one (dunning.evidence.processing)."""

from __future__ import annotations

from functools import cache

from django.db import connection
from django.db.models import Field

from dunning.models import ProviderEvent

# The bookkeeping an event's processing writes once it has an outcome (all in MUTABLE_FIELDS).
OUTCOME_FIELDS = ("outcome", "outcome_detail", "subscription", "invoice", "cycle", "processed_at", "attempts", "error")


@cache
def _outcome_update() -> tuple[str, tuple[Field, ...]]:
    fields = tuple(ProviderEvent._meta.get_field(name) for name in OUTCOME_FIELDS)
    assert {f.name for f in fields} <= ProviderEvent.MUTABLE_FIELDS  # the append-only model's own rule
    qn = connection.ops.quote_name
    sql = (f"UPDATE {qn(ProviderEvent._meta.db_table)} SET {', '.join(f'{qn(f.column)} = %s' for f in fields)} "
           f"WHERE {qn(ProviderEvent._meta.pk.column)} = %s")
    return sql, fields


def event_outcome_record(event: ProviderEvent) -> None:
    """`event.save(update_fields=OUTCOME_FIELDS)` as one prepared UPDATE: the same statement and
    values (each field's database conversion), without building the save's query (update_fields
    checks, signals, the compiler) on every paid event."""
    sql, fields = _outcome_update()
    with connection.cursor() as cursor:
        cursor.execute(sql, [f.get_db_prep_save(getattr(event, f.attname), connection) for f in fields] + [event.pk])
