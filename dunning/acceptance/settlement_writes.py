"""The writes that end an acceptance (SPEC §6 steps 4–5), in one statement on PostgreSQL.

Settlement decides in memory; what it then writes is: the transition receipt, the entitlement
snapshot when a new one is issued (citing the receipt), the subscription's changed columns with
their history row, and the outbox rows with theirs (citing the receipt). Through the ORM that is
up to six statements, each compiled and sent on its own, and most of an acceptance's Python.
Here they are data-modifying CTEs of one statement, one round trip, still in the acceptance's
transaction: the snapshot and the outbox rows take the receipt's id from the receipt's INSERT,
the history rows are copied from what the INSERT / UPDATE returned.

The columns and values are the models' own, as Django's INSERT and UPDATE would send them (each
field's `pre_save`, so `auto_now` stamps, and its database conversion); the history rows are the
ones simple_history writes (its user and change reason, `+` for a new outbox row, `~` for the
changed subscription). The embedded SQLite demo has no INSERT in a CTE: it saves through the ORM.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Model
from django.utils import timezone
from simple_history.utils import bulk_create_with_history, get_change_reason_from_object

from dunning.acceptance.row_inserts import insert_fields as _fields
from dunning.acceptance.row_inserts import insert_params as _insert_params
from dunning.acceptance.row_inserts import mark_saved as _saved
from dunning.models import OutboxMessage, TransitionReceipt
from entitlements.models import EntitlementSnapshot
from subscriptions.models import Subscription

HISTORY_EXTRA = ("history_date", "history_change_reason", "history_type", "history_user_id")


@dataclass(frozen=True)
class SettlementWrites:
    receipt: TransitionReceipt  # unsaved; the snapshot and the outbox rows cite it
    snapshot: EntitlementSnapshot | None
    subscription: Subscription
    update_fields: tuple[str, ...]  # the subscription's columns to save; empty: the row is left alone
    outbox: Sequence[OutboxMessage]


def settlement_write(writes: SettlementWrites) -> None:
    """Write the receipt, snapshot, subscription change and outbox rows; sets their primary keys."""
    db = connections[DEFAULT_DB_ALIAS]
    if db.vendor != "postgresql" or not getattr(settings, "SIMPLE_HISTORY_ENABLED", True):
        _write_orm(writes)
        return
    sql = _statement(writes.snapshot is not None, len(writes.outbox), writes.update_fields)
    params = _insert_params(db, writes.receipt)
    if writes.snapshot is not None:
        params += _insert_params(db, writes.snapshot, but="cause_receipt")
    if writes.update_fields:
        subscription = writes.subscription
        params += [f.get_db_prep_save(f.pre_save(subscription, False), db) for f in _fields(Subscription)
                   if f.attname in writes.update_fields]
        params += [subscription.pk, *_history_params(subscription, "~")]
    for message in writes.outbox:
        params += _insert_params(db, message, but="receipt")
        params += _history_params(message, "+")
    with db.cursor() as cursor:
        cursor.execute(sql, params)
        receipt_pk, snapshot_pk, *outbox_pks = cursor.fetchone()
    _saved(db, writes.receipt, receipt_pk)
    if writes.snapshot is not None:
        writes.snapshot.cause_receipt_id = receipt_pk
        _saved(db, writes.snapshot, snapshot_pk)
    for message, pk in zip(writes.outbox, outbox_pks, strict=True):
        message.receipt_id = receipt_pk
        _saved(db, message, pk)


def _write_orm(writes: SettlementWrites) -> None:
    """The same rows through the ORM (the SQLite demo): the history rows from simple_history."""
    writes.receipt.save(force_insert=True)
    if writes.snapshot is not None:
        writes.snapshot.save(force_insert=True)
    if writes.update_fields:
        writes.subscription.save(update_fields=list(writes.update_fields))
    if writes.outbox:
        # One INSERT for the rows and one for their history rows (the same rows the post_save
        # signal writes one at a time, user included), instead of two statements per row.
        bulk_create_with_history(list(writes.outbox), OutboxMessage)


def _history_params(obj: Model, history_type: str) -> list[Any]:
    """The history row's own columns, as simple_history fills them for `obj`: its date, change
    reason (None unless one was set), type and user (the instance's, else the request's)."""
    user = _history_model(type(obj)).get_default_history_user(obj)
    return [getattr(obj, "_history_date", None) or timezone.now(), get_change_reason_from_object(obj),
            history_type, user.pk if user is not None else None]


@cache
def _history_model(model: type[Model]) -> type[Model]:
    # `Model.history` builds a new manager class on every access; its model never changes.
    return model.history.model


@cache
def _statement(snapshot: bool, outbox_rows: int, update_fields: tuple[str, ...]) -> str:
    """The one statement of a settlement of this shape; the final SELECT returns the receipt's,
    the snapshot's and each outbox row's id."""
    db = connections[DEFAULT_DB_ALIAS]
    qn = db.ops.quote_name

    def insert(name: str, model: type[Model], but: str = "", returning: str = "id") -> str:
        fields = _fields(model, but)
        columns = [qn(f.column) for f in fields] + ([qn(model._meta.get_field(but).column)] if but else [])
        values = ["%s"] * len(fields) + (["r.id"] if but else [])
        source = " FROM r" if but else ""
        return (f"{name} AS (INSERT INTO {qn(model._meta.db_table)} ({', '.join(columns)}) "
                f"SELECT {', '.join(values)}{source} RETURNING {returning})")

    def history(name: str, source: str, model: type[Model]) -> str:
        hist = _history_model(model)
        columns = [qn(f.column) for f in hist.tracked_fields]
        extra = [qn(hist._meta.get_field(f).column) for f in HISTORY_EXTRA]
        return (f"{name} AS (INSERT INTO {qn(hist._meta.db_table)} ({', '.join(columns + extra)}) "
                f"SELECT {', '.join(columns)}, %s, %s, %s, %s FROM {source})")

    ctes = [insert("r", TransitionReceipt)]
    if snapshot:
        ctes.append(insert("e", EntitlementSnapshot, but="cause_receipt"))
    if update_fields:
        sets = [f"{qn(f.column)} = %s" for f in _fields(Subscription) if f.attname in update_fields]
        ctes.append(f"u AS (UPDATE {qn(Subscription._meta.db_table)} SET {', '.join(sets)} "
                    f"WHERE {qn('id')} = %s RETURNING *)")
        ctes.append(history("uh", "u", Subscription))
    for i in range(outbox_rows):
        ctes.append(insert(f"o{i}", OutboxMessage, but="receipt", returning="*"))
        ctes.append(history(f"oh{i}", f"o{i}", OutboxMessage))
    ids = ["r.id", "(SELECT id FROM e)" if snapshot else "NULL",
           *(f"(SELECT id FROM o{i})" for i in range(outbox_rows))]
    return f"WITH {', '.join(ctes)} SELECT {', '.join(ids)} FROM r"
