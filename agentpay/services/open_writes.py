"""The rows of an intent's open (intent_open), in one statement on PostgreSQL.

An unpaid on-chain call's open is the whole of its 402 (issue 18): the intent `challenged`, its
settlement and fulfillment, the challenge, the receipts of `opened` and `challenge_issued`, and
generation 1's outbox row. Through the ORM that is five INSERTs, each compiled and sent on its
own, and most of a 402's Python. Here they are data-modifying CTEs of one statement, one round
trip, in intent_open's transaction: every other row takes the intent's id from the intent's
INSERT. The receipts are chained (the second selects from the first's RETURNING), so they get
their ids in the order the ORM's one INSERT gives them.

The columns and values are the models' own, as Django's INSERT would send them (each field's
`pre_save` and database conversion), the house pattern of dunning/acceptance/settlement_writes.py.
The embedded SQLite demo has no INSERT in a CTE: it saves through the ORM, the same rows
(tests/agentpay/test_open_writes.py compares both paths on PostgreSQL).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Model

from agentpay.bridge import insert_fields as _fields
from agentpay.bridge import insert_params as _insert_params
from agentpay.bridge import mark_saved as _saved
from agentpay.models import (
    AccountKind,
    Fulfillment,
    IntentReceipt,
    LedgerAccount,
    OutboxMessage,
    PaymentIntent,
    Settlement,
    Transfer,
)
from agentpay.services.insert_values import insert_values
from agentpay.services.ledger import StaleSystemAccount
from agentpay.services.ledger_writes import hold_ctes, hold_params
from agentpay.services.locking import WALLET_COLUMNS, wallet_load

# False: the ORM's statements on PostgreSQL too (the test that compares both paths sets it).
ONE_STATEMENT = True


@dataclass(frozen=True)
class OpenWrites:
    intent: PaymentIntent  # all unsaved; every other row belongs to the intent
    settlement: Settlement
    fulfillment: Fulfillment
    children: Sequence[Model]  # rows an effect made for the intent (the challenge), each with an `intent` FK
    receipts: Sequence[IntentReceipt]
    outbox: OutboxMessage | None
    # The settlement's hold, unsaved (ledger_hold write=False; the intent inserted already): written
    # first, the settlement citing it. StaleSystemAccount when its system account moved no row.
    hold: Transfer | None = None


def open_is_one_statement() -> bool:
    """An open whose steps all defer their rows is written by one statement (open_write): the
    caller need not wrap it in a transaction."""
    return connections[DEFAULT_DB_ALIAS].vendor == "postgresql" and ONE_STATEMENT


def open_write(writes: OpenWrites) -> None:
    """Insert the intent (unless it is saved already) and its rows; sets their primary keys and
    intent ids."""
    db = connections[DEFAULT_DB_ALIAS]
    if db.vendor != "postgresql" or not ONE_STATEMENT:
        _write_orm(writes)
        return
    rows = [writes.settlement, writes.fulfillment, *writes.children, *writes.receipts,
            *([writes.outbox] if writes.outbox is not None else [])]
    inserted = not writes.intent._state.adding
    hold = writes.hold
    sql = _statement(tuple(type(row) for row in rows), inserted, hold is not None)
    # insert_values: Django's conversions, without its per-value calls where they change nothing.
    params = [writes.intent.pk] if inserted else insert_values(db, writes.intent)
    if hold is not None:
        params += hold_params(hold)
    for row in rows:
        values = insert_values(db, row, but="intent")
        if hold is not None and row is writes.settlement:
            del values[_SETTLEMENT_HOLD]  # the statement takes it from the hold's INSERT
        params += values
    with db.cursor() as cursor:
        cursor.execute(sql, params)  # ~110 values: parsed once per shape (dunning.psycopg_cache)
        found = cursor.fetchone()
    if found is None:  # the hold's system account moved no row, so nothing cites it: roll back
        raise StaleSystemAccount(f"no system account {hold.credit_account_id if hold else '?'}")
    intent_pk, *pks = found
    if hold is not None:
        hold_pk, *pks = pks
        _saved(db, hold, hold_pk)
        writes.settlement.hold = hold  # its id, now the hold has one (and the hold stays cached)
    _saved(db, writes.intent, intent_pk)
    for row, pk in zip(rows, pks, strict=True):
        row.intent_id = intent_pk
        _saved(db, row, pk)


def open_insert_locking_wallet(intent: PaymentIntent) -> LedgerAccount | None:
    """Insert `intent`, then lock its tenant's wallet in its currency (the acceptance's lock
    order: the intent's rows, then the wallet), in one statement on PostgreSQL: the wallet joins
    the INSERT's RETURNING, so the statement reaches the wallet only once the intent is in, and
    locks it only then. The wallet, or None when the tenant has none in that currency."""
    db = connections[DEFAULT_DB_ALIAS]
    if db.vendor != "postgresql" or not ONE_STATEMENT:
        intent.save(force_insert=True)
        return (LedgerAccount.objects.select_for_update()
                .filter(kind=AccountKind.WALLET, tenant_id=intent.tenant_id, currency=intent.currency).first())
    with db.cursor() as cursor:
        cursor.execute(_insert_locking_wallet(), [*_insert_params(db, intent), AccountKind.WALLET.value])
        row = cursor.fetchone()
    if row is None:  # no such wallet (the hold will refuse); the intent is in all the same
        mine = PaymentIntent.objects.filter(tenant_id=intent.tenant_id, idempotency_key=intent.idempotency_key)
        _saved(db, intent, mine.values_list("pk", flat=True).get())
        return None
    _saved(db, intent, row[0])
    return wallet_load(list(row[1:]))


def _write_orm(writes: OpenWrites) -> None:
    if writes.hold is not None:
        raise ValueError("a deferred hold needs the one statement")
    if writes.intent._state.adding:
        writes.intent.save(force_insert=True)
    for row in (writes.settlement, writes.fulfillment, *writes.children):
        row.intent = writes.intent  # the FK's id, now the intent has one
        row.save(force_insert=True)
    for receipt in writes.receipts:
        receipt.intent = writes.intent
    IntentReceipt.objects.bulk_create(list(writes.receipts))  # one INSERT
    if writes.outbox is not None:
        writes.outbox.intent = writes.intent
        writes.outbox.save(force_insert=True)


@cache
def _insert_locking_wallet() -> str:
    qn = connections[DEFAULT_DB_ALIAS].ops.quote_name
    fields = _fields(PaymentIntent)
    pk = qn(PaymentIntent._meta.pk.column)
    return (f"WITH i AS (INSERT INTO {qn(PaymentIntent._meta.db_table)} ({', '.join(qn(f.column) for f in fields)}) "
            f"VALUES ({', '.join(['%s'] * len(fields))}) RETURNING {pk} AS id, tenant_id, currency) "
            f"SELECT i.id, {WALLET_COLUMNS} FROM i JOIN {qn(LedgerAccount._meta.db_table)} w "
            f"ON w.tenant_id = i.tenant_id AND w.currency = i.currency AND w.kind = %s FOR UPDATE OF w")


# Where the settlement's hold is among its INSERT's values (a deferred hold's id comes from `h`).
_SETTLEMENT_HOLD = [f.name for f in _fields(Settlement, "intent")].index("hold")


@cache
def _statement(shape: tuple[type[Model], ...], inserted: bool = False, hold: bool = False) -> str:
    """The one statement of an open writing the intent and rows of these models, in this order;
    the final SELECT returns the intent's id, then each row's. `inserted`: the intent is in
    already (the wallet's hold needed it first), its id is the first parameter. `hold`: the
    hold's CTEs (ledger_writes.hold_ctes, its INSERT named `h`) after the intent, the
    settlement's hold_id from `h`, and the hold's id selected after the intent's: no row at all
    when the hold's system account moved none (the settlement selects from `h`)."""
    qn = connections[DEFAULT_DB_ALIAS].ops.quote_name

    def insert(name: str, model: type[Model], source: str) -> str:
        fields = _fields(model, "intent" if source else "")
        columns = [qn(f.column) for f in fields] + ([qn(model._meta.get_field("intent").column)] if source else [])
        values = ["%s"] * len(fields) + ([f"i.{qn(PaymentIntent._meta.pk.column)}"] if source else [])
        if hold and model is Settlement:
            values[_SETTLEMENT_HOLD], source = "h.id", f"{source}, h"
        return (f"{name} AS (INSERT INTO {qn(model._meta.db_table)} ({', '.join(columns)}) "
                f"SELECT {', '.join(values)}{' FROM ' + source if source else ''} "
                f"RETURNING {qn(model._meta.pk.column)} AS id)")

    intent = f"i AS (SELECT %s AS {qn(PaymentIntent._meta.pk.column)})" if inserted else insert("i", PaymentIntent, "")
    ctes, names, previous_receipt = [intent], ["i"], ""
    if hold:
        ctes.append(hold_ctes("h"))
        names.append("h")
    for n, model in enumerate(shape):
        name = f"w{n}"
        # A receipt after another selects from its RETURNING: inserted after it, a higher id.
        source = f"i, {previous_receipt}" if model is IntentReceipt and previous_receipt else "i"
        ctes.append(insert(name, model, source))
        names.append(name)
        if model is IntentReceipt:
            previous_receipt = name
    return (f"WITH {', '.join(ctes)} SELECT {', '.join(f'{name}.id' for name in names)} "
            f"FROM {', '.join(names)}")
