"""The rows an accepted generation writes (intent_accept), in one statement on PostgreSQL.

After its effects, an acceptance writes the intent's compare-and-set UPDATE (the generation as
the lock read loaded it), the settlement's and the fulfillment's UPDATE when their line moved or
an effect set a field, one receipt per step and the generation's outbox row: up to five
statements through the ORM, each compiled and sent on its own. Here they are data-modifying
CTEs of one statement, in the acceptance's transaction, with the hold's capture or release when
a step asked one (its transfer and both accounts' totals, ledger_writes.resolution_ctes, last:
the ledger's locks after the intent's rows, which are all locked already). A hold resolved
already skips the transfer's INSERT and so moves no total; the acceptance then refuses
HOLD_ALREADY_RESOLVED, which rolls the generation back with the transaction. Every other row selects from the intent's
UPDATE, so when the compare-and-set finds another generation nothing at all is written and the
statement returns no row. The rows are all locked by the acceptance's lock read already (or new),
so the order the CTEs run in takes no lock another acceptance could be waiting for. The receipts
are chained (each selects from the one before's RETURNING), so their ids come in step order, as
the ORM's one INSERT gives them.

The values are the ones Django sends: the UPDATE's field by field (`get_db_prep_save`, as
QuerySet.update and save(update_fields=…) do) and the INSERTs' as its INSERT
(`insert_values`, which converts them as agentpay.bridge's insert_params does, the house pattern of
open_writes.py). The embedded SQLite demo
writes through the ORM, the same statements as before (tests/agentpay/test_accept_writes.py
compares both paths on PostgreSQL, row for row).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Model

from agentpay.bridge import insert_fields, mark_saved
from agentpay.models import (
    Fulfillment,
    GatewayRequest,
    IntentReceipt,
    OutboxMessage,
    PaymentIntent,
    Settlement,
    Transfer,
    TransferKind,
)
from agentpay.services import ledger_writes
from agentpay.services.insert_values import insert_values
from agentpay.services.ledger_writes import resolution_ctes, resolution_params
from agentpay.services.results import RequestAnswer

# False: the ORM's statements on PostgreSQL too (the test that compares both paths sets it).
ONE_STATEMENT = True


@dataclass
class AcceptWrites:
    intent: PaymentIntent  # its fields as accepted; `loaded_generation` is the one the lock read found
    loaded_generation: int
    intent_fields: dict[str, Any]  # the intent's UPDATE: field name → value (generation and state included)
    settlement: Settlement
    settlement_fields: Sequence[str]  # empty: the settlement is not written
    fulfillment: Fulfillment
    fulfillment_fields: Sequence[str]
    receipts: Sequence[IntentReceipt]  # unsaved, step order
    outbox: OutboxMessage  # unsaved
    # A capture's or release's transfer (unsaved, ledger_capture/ledger_release with write=False):
    # written with the generation, its pk left None when the hold was resolved already.
    resolution: Transfer | None = None
    # True: a hold resolved already fails the statement on its unique index (IntegrityError, nothing
    # written) instead of the resolution being skipped: for a statement that commits on its own.
    exclusive_resolution: bool = False
    # The request's row takes its answer in the same statement (only when the generation is written).
    request_answer: RequestAnswer | None = None
    request_answered: bool = False  # set by accept_write: the request's row took `request_answer`


def one_statement() -> bool:
    """Whether accept_write writes in one statement (and so can take a deferred resolution)."""
    return ONE_STATEMENT and ledger_writes.one_statement()


def accept_write(writes: AcceptWrites) -> bool:
    """Write the generation; False, with nothing written, when the intent is not at
    `loaded_generation` any more. Sets the receipts' and the outbox row's primary keys."""
    db = connections[DEFAULT_DB_ALIAS]
    if db.vendor != "postgresql" or not ONE_STATEMENT:
        if writes.resolution is not None:
            raise ValueError("a deferred resolution needs the one statement (accept_writes.one_statement())")
        return _write_orm(writes)
    intent_names = tuple(writes.intent_fields)
    settlement_names, fulfillment_names = tuple(writes.settlement_fields), tuple(writes.fulfillment_fields)
    params = [_prep(db, PaymentIntent, name, value) for name, value in writes.intent_fields.items()]
    params += [writes.intent.pk, writes.loaded_generation]
    for row, names in ((writes.settlement, settlement_names), (writes.fulfillment, fulfillment_names)):
        if names:
            params += [_prep(db, type(row), name, getattr(row, type(row)._meta.get_field(name).attname))
                       for name in names]
            params.append(row.pk)
    for row in (*writes.receipts, writes.outbox):
        params += insert_values(db, row, but="intent")
    resolution = writes.resolution
    kind = "" if resolution is None else resolution.kind
    if resolution is not None:
        params += resolution_params(resolution)
    answer = writes.request_answer
    if answer is not None:
        params += [_prep(db, GatewayRequest, name, getattr(answer, attribute)) for name, attribute in _ANSWERED]
        params.append(_prep(db, GatewayRequest, "request_id", answer.request_id))
    sql = _statement(intent_names, settlement_names, fulfillment_names, len(writes.receipts), kind,
                     writes.exclusive_resolution, answer is not None)
    with db.cursor() as cursor:
        cursor.execute(sql, params)
        found = cursor.fetchone()
    if found is None:
        return False
    if answer is not None:
        *found, answered = found
        writes.request_answered = answered == 1
    if resolution is not None:
        *found, resolution_pk, moved = found
        if resolution_pk is not None:
            if moved != 1:  # an account id taken from the hold itself (a foreign key): cannot happen
                raise LookupError(f"an account of {resolution.pending_id} did not move")
            mark_saved(db, resolution, resolution_pk)
    for row, pk in zip((*writes.receipts, writes.outbox), found, strict=True):
        mark_saved(db, row, pk)
    return True


# The request row's answer: its field ← RequestAnswer's attribute.
_ANSWERED = (("answer_status", "status"), ("answer_problem", "problem"), ("answered_at", "answered_at"),
             ("duration_ms", "duration_ms"))


def _prep(db: Any, model: type[Model], name: str, value: Any) -> Any:
    return model._meta.get_field(name).get_db_prep_save(value, db)


def _write_orm(writes: AcceptWrites) -> bool:
    changed = PaymentIntent.objects.filter(pk=writes.intent.pk, generation=writes.loaded_generation).update(
        **writes.intent_fields)
    if changed != 1:
        return False
    if writes.settlement_fields:
        writes.settlement.save(update_fields=list(writes.settlement_fields))
    if writes.fulfillment_fields:
        writes.fulfillment.save(update_fields=list(writes.fulfillment_fields))
    IntentReceipt.objects.bulk_create(list(writes.receipts))  # one INSERT; PostgreSQL returns the ids in order
    writes.outbox.save(force_insert=True)
    answer = writes.request_answer
    if answer is not None:
        writes.request_answered = GatewayRequest.objects.filter(request_id=answer.request_id).update(
            **{name: getattr(answer, attribute) for name, attribute in _ANSWERED}) == 1
    return True


@cache
def _statement(intent_names: tuple[str, ...], settlement_names: tuple[str, ...], fulfillment_names: tuple[str, ...],
               receipts: int, resolution: str = "", exclusive: bool = False, answered: bool = False) -> str:
    """The intent's compare-and-set, the lines' UPDATEs that have fields, `receipts` receipts,
    the outbox row and, when `resolution` (a transfer kind), the hold's resolution with both
    accounts' totals; selects the receipts' ids and the outbox row's (then the resolution's id
    and how many credit accounts moved), no row when the CAS failed. `exclusive`: the resolution's
    INSERT without ON CONFLICT (ledger_writes.resolution_ctes). `answered`: the request's row takes
    its answer (from `i`: only with the generation), last, and how many rows it moved is selected last."""
    qn = connections[DEFAULT_DB_ALIAS].ops.quote_name

    def sets(model: type[Model], names: tuple[str, ...]) -> str:
        return ", ".join(f"{qn(model._meta.get_field(name).column)} = %s" for name in names)

    def update(name: str, model: type[Model], names: tuple[str, ...]) -> str:
        table = qn(model._meta.db_table)
        return (f"{name} AS (UPDATE {table} SET {sets(model, names)} FROM i "
                f"WHERE {table}.{qn(model._meta.pk.column)} = %s RETURNING 1)")

    def insert(name: str, model: type[Model], source: str) -> str:
        fields = insert_fields(model, "intent")
        columns = [qn(f.column) for f in fields] + [qn(model._meta.get_field("intent").column)]
        return (f"{name} AS (INSERT INTO {qn(model._meta.db_table)} ({', '.join(columns)}) "
                f"SELECT {', '.join(['%s'] * len(fields))}, i.id FROM {source} "
                f"RETURNING {qn(model._meta.pk.column)} AS id)")

    intent = qn(PaymentIntent._meta.db_table)
    ctes = [f"i AS (UPDATE {intent} SET {sets(PaymentIntent, intent_names)} "
            f"WHERE {qn(PaymentIntent._meta.pk.column)} = %s AND {qn('generation')} = %s "
            f"RETURNING {qn(PaymentIntent._meta.pk.column)} AS id)"]
    if settlement_names:
        ctes.append(update("s", Settlement, settlement_names))
    if fulfillment_names:
        ctes.append(update("f", Fulfillment, fulfillment_names))
    names = []
    for n in range(receipts):
        # A receipt after another selects from its RETURNING: inserted after it, a higher id.
        ctes.append(insert(f"r{n}", IntentReceipt, f"i, r{n - 1}" if n else "i"))
        names.append(f"r{n}")
    ctes.append(insert("o", OutboxMessage, "i"))
    names.append("o")
    selected = [f"{name}.id" for name in names]
    if resolution:
        # Last, from the intent's and the lines' UPDATEs: the ledger's locks (the hold's index
        # entry, the wallet, the system account) are taken after the intent's rows, in the
        # ledger's order (ledger_writes). Selecting from `s` and `f` makes their UPDATEs run first:
        # nothing else reads them, and an unread CTE runs only at the statement's end.
        lines = ", s" * bool(settlement_names) + ", f" * bool(fulfillment_names)
        ctes.append(resolution_ctes(resolution == TransferKind.POST_PENDING, f"i{lines}",
                                    skip_resolved=not exclusive))
        selected += ["(SELECT id FROM t)", "(SELECT count(*) FROM c)"]
    if answered:  # runs to completion though nothing selects from it, as every data-modifying CTE
        table = qn(GatewayRequest._meta.db_table)
        ctes.append(f"q AS (UPDATE {table} SET {sets(GatewayRequest, tuple(name for name, _ in _ANSWERED))} "
                    f"FROM i WHERE {table}.{qn('request_id')} = %s RETURNING 1)")
        selected.append("(SELECT count(*) FROM q)")
    return f"WITH {', '.join(ctes)} SELECT {', '.join(selected)} FROM {', '.join(names)}"
