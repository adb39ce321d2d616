"""The acceptance's lock read: intent → settlement → fulfillment (→ wallet) in one statement.

The ORM needed three or four `SELECT … FOR UPDATE` round trips per acceptance, and building and
loading them was over half of an acceptance's Python (bench/last_run/agentpay.md). This is the
same read as one hand-written statement: the same rows, locked in the same order (the order of
`FOR UPDATE OF`, so two acceptances still never deadlock on them), loaded into model instances
with their tenant and hold attached.

One statement has one snapshot, taken before it waits for a lock. What that changes, and why
it is still exact:
- the locked rows (intent, settlement, fulfillment, wallet) are re-read at their newest version
  once the lock is granted (PostgreSQL's READ COMMITTED recheck), as the separate statements
  read them;
- the unlocked rows are read as of the snapshot. The tenant is read unlocked before too. The
  hold is an append-only transfer, but the settlement may have gained it while this statement
  waited: a `hold_id` without its transfer row is read again (`_hold_of`), never taken for
  "no hold";
- an intent has exactly one settlement (`intent_open` makes it) and one fulfillment, so no row
  can appear that the snapshot misses; a wallet that appears while the statement waits (made
  after the tenant was set up, in that very moment) is found by the statement without the
  wallet's join, then looked up and locked on its own, as before.
"""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.db.models import Field, Model

from agentpay.models import AccountKind, Fulfillment, LedgerAccount, PaymentIntent, Settlement, Tenant, Transfer
from agentpay.states import WALLET

Locked = tuple[PaymentIntent, Settlement, Fulfillment, LedgerAccount | None]


class _Shape:
    """One model's columns in the statement, and how a row's slice becomes an instance."""

    def __init__(self, model: type[Model], alias: str) -> None:
        self.model = model
        self.fields: list[Field] = list(model._meta.concrete_fields)
        self.names = [f.attname for f in self.fields]
        self.select = ", ".join(f'{alias}."{f.column}"' for f in self.fields)
        self.converters = [(i, f.from_db_value) for i, f in enumerate(self.fields) if hasattr(f, "from_db_value")]

    def load(self, values: list[Any]) -> Any:
        for i, convert in self.converters:
            values[i] = convert(values[i], None, connection)
        return self.model.from_db(connection.alias, self.names, values)


_SHAPES = {
    "i": _Shape(PaymentIntent, "i"), "t": _Shape(Tenant, "t"), "s": _Shape(Settlement, "s"),
    "h": _Shape(Transfer, "h"), "f": _Shape(Fulfillment, "f"), "w": _Shape(LedgerAccount, "w"),
}


# The wallet's columns under the alias `w`, and a row's slice of them as an instance (the open's
# INSERT that locks the wallet, open_writes).
WALLET_COLUMNS = _SHAPES["w"].select


def wallet_load(values: list[Any]) -> LedgerAccount:
    return _SHAPES["w"].load(values)


def _statement(with_wallet: bool) -> tuple[str, list[str]]:
    aliases = ["i", "t", "s", "h", "f"] + (["w"] if with_wallet else [])
    wallet_join = (f' JOIN "{LedgerAccount._meta.db_table}" w ON i.rail = %s AND w.kind = %s'
                   ' AND w.tenant_id = i.tenant_id AND w.currency = i.currency') if with_wallet else ""
    sql = (f"SELECT {', '.join(_SHAPES[a].select for a in aliases)}"
           f' FROM "{PaymentIntent._meta.db_table}" i'
           f' JOIN "{Tenant._meta.db_table}" t ON t.id = i.tenant_id'
           f' JOIN "{Settlement._meta.db_table}" s ON s.intent_id = i.id'
           f' LEFT JOIN "{Transfer._meta.db_table}" h ON h.id = s.hold_id'
           f' JOIN "{Fulfillment._meta.db_table}" f ON f.intent_id = i.id'
           f"{wallet_join} WHERE i.intent_id = %s"
           f" ORDER BY s.id DESC LIMIT 1"
           f" FOR UPDATE OF i, s, f{', w' if with_wallet else ''}")
    return sql, aliases


_WITH_WALLET = _statement(True)
_WITHOUT_WALLET = _statement(False)


def _hold_of(settlement: Settlement, hold: Transfer | None) -> Transfer | None:
    if settlement.hold_id is None:
        return None
    if hold is None or hold.pk != settlement.hold_id:  # taken while this statement waited (see above)
        return Transfer.objects.get(pk=settlement.hold_id)
    return hold


def lock_intent(intent_id: str, *, wallet: bool) -> Locked:
    """Lock and load one intent's rows; when `wallet`, also the tenant's wallet in the intent's
    currency if the intent is on the wallet rail. LookupError when there is no such intent."""
    if connection.vendor != "postgresql":
        return _lock_intent_orm(intent_id, wallet=wallet)
    row = None
    if wallet:
        sql, aliases = _WITH_WALLET
        with connection.cursor() as cursor:
            cursor.execute(sql, [WALLET, AccountKind.WALLET.value, intent_id])
            row = cursor.fetchone()
    if row is None:
        sql, aliases = _WITHOUT_WALLET
        with connection.cursor() as cursor:
            cursor.execute(sql, [intent_id])
            row = cursor.fetchone()
    if row is None:
        raise LookupError(f"no payment intent {intent_id}")
    loaded: dict[str, Any] = {}
    at = 0
    for alias in aliases:
        shape = _SHAPES[alias]
        values = list(row[at:at + len(shape.fields)])
        at += len(shape.fields)
        loaded[alias] = None if values[0] is None else shape.load(values)
    intent, settlement, fulfillment = loaded["i"], loaded["s"], loaded["f"]
    PaymentIntent.tenant.field.set_cached_value(intent, loaded["t"])
    Settlement.intent.field.set_cached_value(settlement, intent)
    Settlement.hold.field.set_cached_value(settlement, _hold_of(settlement, loaded["h"]))
    Fulfillment.intent.field.set_cached_value(fulfillment, intent)
    account = loaded.get("w")
    if wallet and account is None and intent.rail == WALLET:  # none yet, or one made while we waited
        account = (LedgerAccount.objects.select_for_update()
                   .filter(kind=AccountKind.WALLET, tenant_id=intent.tenant_id, currency=intent.currency).first())
    return intent, settlement, fulfillment, account


def _lock_intent_orm(intent_id: str, *, wallet: bool) -> Locked:
    """The same rows in the same order through the ORM, one statement each, for the embedded SQLite
    demo (no FOR UPDATE OF there; one writer at a time anyway)."""
    try:
        intent = PaymentIntent.objects.select_for_update(of=("self",)).select_related("tenant").get(intent_id=intent_id)
    except PaymentIntent.DoesNotExist:
        raise LookupError(f"no payment intent {intent_id}") from None
    settlement = (Settlement.objects.select_for_update(of=("self",)).select_related("hold").filter(intent=intent)
                  .order_by("-pk").first())
    fulfillment = Fulfillment.objects.select_for_update().get(intent=intent)
    account = None
    if wallet and intent.rail == WALLET:
        account = (LedgerAccount.objects.select_for_update()
                   .filter(kind=AccountKind.WALLET, tenant_id=intent.tenant_id, currency=intent.currency).first())
    return intent, settlement, fulfillment, account
