"""The rows of an intent's open (intent_open), in one statement on PostgreSQL.

An unpaid on-chain call's open is the whole of its 402 (issue 18): the intent `challenged`, its
settlement and fulfillment, the challenge, the receipts of `opened` and `challenge_issued`, and
generation 1's outbox row. Through the ORM that is five INSERTs, each compiled and sent on its
own, and most of a 402's Python. Here they are data-modifying CTEs of one statement, one round
trip, in intent_open's transaction: every other row takes the intent's id from the intent's
INSERT. The receipts are chained (the second selects from the first's RETURNING), so they get
their ids in the order the ORM's one INSERT gives them.

A wallet call's open holds its amount on the tenant's wallet. Checked on the wallet as read
without a lock (the gateway's front read), the hold is written `guarded`, in one statement
committed alone: the intent's INSERT, then the wallet's pending debits moved only while the row
still is that tenant's unfrozen wallet in the currency with the amount available, the system
account's after it (ledger_writes.guarded_hold_ctes), and the rest. Every row after the intent's
selects from `g`, which fails the statement when the wallet or the system account moved no row,
so then nothing at all is written (WalletGuardRefused: the caller opens the intent plainly and
the acceptance, with the wallet locked, refuses and records why; StaleSystemAccount). The locks
come in the order every open takes them: the intent's key (an open of a key some request is
opening or accepting waits for it holding nothing), then the wallet, then the system account.
The wallet stays locked for the rest of the statement and its commit, not for a round trip.

The columns and values are the models' own, as Django's INSERT would send them (each field's
`pre_save` and database conversion), the house pattern of dunning/acceptance/settlement_writes.py.
The embedded SQLite demo has no INSERT in a CTE: it saves through the ORM, the same rows
(tests/agentpay/test_open_writes.py compares both paths on PostgreSQL).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from django.db import DEFAULT_DB_ALIAS, DataError, connections
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
from agentpay.services.ledger_writes import (
    STALE_SYSTEM_ACCOUNT,
    WALLET_REFUSED_HOLD,
    guarded_hold_ctes,
    guarded_hold_params,
    hold_ctes,
    hold_params,
)
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


class WalletGuardRefused(Exception):
    """The wallet as read took the hold, the wallet as it is did not: nothing was written."""


def open_is_one_statement() -> bool:
    """An open whose steps all defer their rows is written by one statement (open_write): the
    caller need not wrap it in a transaction."""
    return connections[DEFAULT_DB_ALIAS].vendor == "postgresql" and ONE_STATEMENT


def open_write(writes: OpenWrites) -> None:
    """Insert the intent (unless it is saved already) and its rows; sets their primary keys and
    intent ids. A hold with the intent not inserted yet is written guarded (the module's
    docstring): WalletGuardRefused when the wallet did not take it."""
    db = connections[DEFAULT_DB_ALIAS]
    if db.vendor != "postgresql" or not ONE_STATEMENT:
        _write_orm(writes)
        return
    rows = [writes.settlement, writes.fulfillment, *writes.children, *writes.receipts,
            *([writes.outbox] if writes.outbox is not None else [])]
    inserted = not writes.intent._state.adding
    hold = writes.hold
    guarded = hold is not None and not inserted
    sql = _statement(tuple(type(row) for row in rows), inserted, hold is not None)
    # insert_values: Django's conversions, without its per-value calls where they change nothing.
    if guarded:
        params = [*insert_values(db, writes.intent), *guarded_hold_params(hold, writes.intent.tenant_id),
                  *insert_values(db, hold, but="intent")]
    else:
        params = [writes.intent.pk] if inserted else insert_values(db, writes.intent)
        if hold is not None:
            params += hold_params(hold)
    for row in rows:
        values = insert_values(db, row, but="intent")
        if hold is not None and row is writes.settlement:
            del values[_SETTLEMENT_HOLD]  # the statement takes it from the hold's INSERT
        params += values
    with db.cursor() as cursor:
        try:
            cursor.execute(sql, params)  # ~110 values: parsed once per shape (dunning.psycopg_cache)
        except DataError as exc:  # `g` failed the statement: nothing was written
            _raise_guard_refusal(exc, hold)
            raise
        found = cursor.fetchone()
    if found is None:  # the hold's system account moved no row, so nothing cites it: roll back
        raise StaleSystemAccount(f"no system account {hold.credit_account_id if hold else '?'}")
    intent_pk, *pks = found
    if hold is not None:
        hold_pk, *pks = pks
        _saved(db, hold, hold_pk)
        hold.intent_id = intent_pk  # a guarded hold was made before the intent had an id
        writes.settlement.hold = hold  # its id, now the hold has one (and the hold stays cached)
    _saved(db, writes.intent, intent_pk)
    for row, pk in zip(rows, pks, strict=True):
        row.intent_id = intent_pk
        _saved(db, row, pk)


def _raise_guard_refusal(exc: DataError, hold: Transfer | None) -> None:
    """The refusal `g` raised (ledger_writes.GUARD_REFUSALS), if it was one."""
    said = str(exc)
    if hold is not None and STALE_SYSTEM_ACCOUNT in said:
        raise StaleSystemAccount(f"no system account {hold.credit_account_id}") from None
    if hold is not None and WALLET_REFUSED_HOLD in said:
        raise WalletGuardRefused(f"wallet {hold.debit_account_id} did not take {hold.amount}") from None


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
    when the hold's system account moved none (the settlement selects from `h`). `hold` with the
    intent not `inserted`: guarded (the module's docstring): the intent's INSERT, then
    ledger_writes.guarded_hold_ctes, and every other row from its `g`."""
    qn = connections[DEFAULT_DB_ALIAS].ops.quote_name

    guarded = hold and not inserted

    def insert(name: str, model: type[Model], source: str) -> str:
        """`source`: the CTEs the row selects from, the intent's id from `i` (and `g`, guarded)."""
        fields = _fields(model, "intent" if source else "")
        columns = [qn(f.column) for f in fields] + ([qn(model._meta.get_field("intent").column)] if source else [])
        values = ["%s"] * len(fields) + ([f"i.{qn(PaymentIntent._meta.pk.column)}"] if source else [])
        if hold and model is Settlement:
            values[_SETTLEMENT_HOLD], source = "h.id", f"{source}, h"
        if guarded and source:
            source = f"{source}, g"
        return (f"{name} AS (INSERT INTO {qn(model._meta.db_table)} ({', '.join(columns)}) "
                f"SELECT {', '.join(values)}{' FROM ' + source if source else ''} "
                f"RETURNING {qn(model._meta.pk.column)} AS id)")

    if inserted:
        ctes = [f"i AS (SELECT %s AS {qn(PaymentIntent._meta.pk.column)})"]
    elif guarded:
        ctes = [insert("i", PaymentIntent, ""), guarded_hold_ctes("i")]
    else:
        ctes = [insert("i", PaymentIntent, "")]
    names, previous_receipt = ["i"], ""
    if guarded:
        ctes.append(insert("h", Transfer, "i"))
        names.append("h")
    elif hold:
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
