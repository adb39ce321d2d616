"""A hold, and its capture or release, in one statement each on PostgreSQL.

Through the ORM a resolution is five statements: a savepoint, the resolving transfer's INSERT
(the unique `hold_resolved_once` refuses a second one), the savepoint's release, and one UPDATE
of each account's totals. Here they are data-modifying CTEs of one statement: the INSERT skips a
second resolution of the hold (`ON CONFLICT … DO NOTHING` on that unique index, which waits for
a concurrent first one exactly as the plain INSERT does), and each UPDATE takes its amount from
the row before it, so nothing moves when the transfer was not written, and the rows are taken in
the ledger's order: the hold's index entry, the debit account (the wallet), then the credit
account (the system account, always last). A CTE's UPDATE locks its row only once the row it
joins has come out of the CTE before it, so that order is the plan's whatever join it picks.

An acceptance that captures or releases writes the same CTEs inside its generation's statement
(accept_writes, `resolution_ctes`), not this one.

The values are the Transfer's own, as Django's INSERT sends them (agentpay.bridge's
insert_params). The embedded SQLite demo resolves through the ORM (ledger._resolve_orm);
tests/agentpay/test_ledger_writes.py compares both paths on PostgreSQL, row for row.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections

from agentpay.bridge import insert_fields, insert_params, mark_saved
from agentpay.models import AccountKind, LedgerAccount, Transfer, TransferKind

# False: the ORM's statements on PostgreSQL too (the test that compares both paths sets it).
ONE_STATEMENT = True


def one_statement() -> bool:
    return ONE_STATEMENT and connections[DEFAULT_DB_ALIAS].vendor == "postgresql"


def hold_write(hold: Transfer) -> bool:
    """Insert `hold` (a pending transfer, unsaved, its debit account the wallet the caller
    locked) and move both accounts' pending totals; False, with nothing written, when its credit
    account (a cached system account id) is not there."""
    db = connections[DEFAULT_DB_ALIAS]
    with db.cursor() as cursor:
        cursor.execute(_hold_statement(), hold_params(hold))
        (pk,) = cursor.fetchone()
    if pk is None:
        return False
    mark_saved(db, hold, pk)
    return True


def resolve_write(resolution: Transfer) -> bool:
    """Insert `resolution` (a post_pending or void_pending of its hold, unsaved) and move both
    accounts' totals; False, with nothing written, when the hold is already resolved."""
    db = connections[DEFAULT_DB_ALIAS]
    with db.cursor() as cursor:
        cursor.execute(_statement(resolution.kind == TransferKind.POST_PENDING), resolution_params(resolution))
        pk, moved = cursor.fetchone()
    if pk is None:
        return False
    if moved != 1:  # an account id taken from the hold itself (a foreign key): cannot happen
        raise LookupError(f"an account of {resolution.pending_id} did not move")
    mark_saved(db, resolution, pk)
    return True


def hold_params(hold: Transfer) -> list[Any]:
    """`hold_ctes`'s parameters, in its order."""
    return [hold.amount, hold.credit_account_id, hold.amount, hold.debit_account_id,
            *insert_params(connections[DEFAULT_DB_ALIAS], hold)]


@cache
def hold_ctes(name: str = "t") -> str:
    """The hold's CTEs: c (the system account's pending credits), d (the wallet's pending debits,
    from c) and `name` (the pending transfer's INSERT, from d, RETURNING its id). The system
    account first: its UPDATE moving no row (a stale cached id) stops the rest. The wallet is
    locked by the caller already, so this takes no lock before the system account's that the
    wallet-then-system order would take after it."""
    qn = connections[DEFAULT_DB_ALIAS].ops.quote_name
    transfer, account = qn(Transfer._meta.db_table), qn(LedgerAccount._meta.db_table)
    fields = insert_fields(Transfer)
    return (f'c AS (UPDATE {account} a SET "credits_pending" = a."credits_pending" + %s WHERE a.id = %s '
            f"RETURNING a.id), "
            f'd AS (UPDATE {account} a SET "debits_pending" = a."debits_pending" + %s FROM c WHERE a.id = %s '
            f"RETURNING a.id), "
            f"{name} AS (INSERT INTO {transfer} ({', '.join(qn(f.column) for f in fields)}) "
            f"SELECT {', '.join(['%s'] * len(fields))} FROM d RETURNING id)")


def guarded_hold_params(hold: Transfer, tenant_id: int) -> list[Any]:
    """`guarded_hold_ctes`'s parameters, in its order."""
    return [hold.credit_account_id, hold.amount, hold.debit_account_id, AccountKind.WALLET.value, tenant_id,
            hold.currency, hold.amount, hold.amount, hold.credit_account_id]


# What `g` of guarded_hold_ctes fails its statement with (a DataError saying it), nothing written.
STALE_SYSTEM_ACCOUNT = "agentpay: no such system account (a stale cached id)"
WALLET_REFUSED_HOLD = "agentpay: the wallet did not take the hold"


@cache
def guarded_hold_ctes(source: str) -> str:
    """The CTEs s (the system account's id, read: a cached id that names no account any more
    finds none), d (the wallet's pending debits, from s and `source`, moved only while the row is
    the tenant's unfrozen wallet in the hold's currency with the amount available: the checks the
    hold's effect made on the wallet as read, again on the row as it is, locked), c (the system
    account's pending credits, from d: the wallet first, the system account after it, the ledger's
    order) and g, one row once both moved. When either moved none, g fails the statement (its
    CASE cast to an integer: STALE_SYSTEM_ACCOUNT or WALLET_REFUSED_HOLD), so every row that
    selects from g is written only with the hold, and the statement writes nothing at all."""
    qn = connections[DEFAULT_DB_ALIAS].ops.quote_name
    account = qn(LedgerAccount._meta.db_table)
    return (f"s AS (SELECT a.id FROM {account} a WHERE a.id = %s), "
            f'd AS (UPDATE {account} a SET "debits_pending" = a."debits_pending" + %s FROM s, {source} '
            f'WHERE a.id = %s AND a."kind" = %s AND a."tenant_id" = %s AND a."currency" = %s AND NOT a."frozen" '
            f'AND a."credits_posted" - a."debits_posted" - a."debits_pending" >= %s RETURNING a.id), '
            f'c AS (UPDATE {account} a SET "credits_pending" = a."credits_pending" + %s FROM d WHERE a.id = %s '
            f"RETURNING a.id), "
            # The cast of a CASE is evaluated as the statement runs, never folded while it is planned;
            # MATERIALIZED: computed once whatever reads it, never inlined and dropped as unread.
            f"g AS MATERIALIZED (SELECT CAST(CASE WHEN NOT EXISTS (SELECT 1 FROM s) THEN '{STALE_SYSTEM_ACCOUNT}' "
            f"WHEN NOT EXISTS (SELECT 1 FROM c) THEN '{WALLET_REFUSED_HOLD}' ELSE '1' END AS integer) AS ok)")


@cache
def _hold_statement() -> str:
    return f"WITH {hold_ctes()} SELECT (SELECT id FROM t)"


def resolution_params(resolution: Transfer) -> list[Any]:
    """`resolution_ctes`'s parameters, in its order."""
    return [*insert_params(connections[DEFAULT_DB_ALIAS], resolution), resolution.debit_account_id,
            resolution.credit_account_id]


@cache
def resolution_ctes(post: bool, source: str = "", skip_resolved: bool = True) -> str:
    """The CTEs t (the resolving transfer's INSERT, skipped when the hold is resolved already, or
    failing the statement on the unique index when not `skip_resolved`), d
    (the debit account's totals) and c (the credit account's), each from the one before;
    `source`: a CTE the INSERT selects from, so it writes nothing when that one has no row (the
    acceptance's compare-and-set). Select `(SELECT id FROM t)` (NULL: already resolved) and
    `(SELECT count(*) FROM c)` (1: both accounts moved)."""
    qn = connections[DEFAULT_DB_ALIAS].ops.quote_name
    transfer, account = qn(Transfer._meta.db_table), qn(LedgerAccount._meta.db_table)
    fields = insert_fields(Transfer)
    pending = qn(Transfer._meta.get_field("pending").column)

    def moved(side: str) -> str:  # the pending total gives the amount back; a capture posts it
        return ", ".join([f'"{side}_pending" = a."{side}_pending" - t.amount',
                          *([f'"{side}_posted" = a."{side}_posted" + t.amount'] if post else [])])

    values = ", ".join(["%s"] * len(fields))
    return (f"t AS (INSERT INTO {transfer} ({', '.join(qn(f.column) for f in fields)}) "
            + (f"SELECT {values} FROM {source} " if source else f"VALUES ({values}) ")
            + (f"ON CONFLICT ({pending}) WHERE {pending} IS NOT NULL DO NOTHING " if skip_resolved else "")
            + "RETURNING id, amount), "
            f"d AS (UPDATE {account} a SET {moved('debits')} FROM t WHERE a.id = %s RETURNING t.id, t.amount), "
            f"c AS (UPDATE {account} a SET {moved('credits')} FROM d t WHERE a.id = %s RETURNING t.id)")


@cache
def _statement(post: bool) -> str:
    return f"WITH {resolution_ctes(post)} SELECT (SELECT id FROM t), (SELECT count(*) FROM c)"
