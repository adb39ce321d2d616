"""The gateway's front read: the API key (by its digest), its tenant, the priced route named in
the URL with its chain network, and the tenant's wallet in the route's currency, in one statement
on PostgreSQL.

Every priced call needs all four before it can do anything, and through the ORM that is two
queries (the key with its tenant, the route with its network), each compiled on every request:
about a quarter of a 402's CPU. Nothing is cached across requests: a revoked key, a price or a
route changed is seen by the next request. The wallet is read without a lock: a wallet call's
open checks its hold on it and writes it guarded, so the row as it is decides
(agentpay.services.open_writes).

The columns are the models' own (`_meta.concrete_fields`), the instances are built as the ORM
builds them (`Model.from_db`), with the tenant cached on the key and the network on the route.
The embedded SQLite demo (and any caller without a route) reads through the ORM, the same two
queries as before (tests/agentpay_x402/test_front_read.py compares both paths on PostgreSQL).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from itertools import islice

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Model
from django.db.models.expressions import Col

from agentpay.models import AccountKind, ChainNetwork, LedgerAccount, PricedRoute, Tenant, TenantApiKey

# False: the ORM's two queries on PostgreSQL too (the test that compares both paths sets it).
ONE_STATEMENT = True
MAX_SLUG = 64  # PricedRoute.slug's max_length: a longer one names no route


@dataclass(frozen=True)
class Front:
    key: TenantApiKey | None  # a live key (not revoked) with its tenant; None: no such key
    route: PricedRoute | None  # the active route of that slug, with its network; None: none (or not asked)
    wallet: LedgerAccount | None = None  # the tenant's wallet in the route's currency, read unlocked


def front_read(key_hash: str, slug: str | None) -> Front:
    """The live key of `key_hash` with its tenant and, when `slug` is given and the key is live,
    the active route of `slug` with its network and the tenant's wallet in its currency."""
    db = connections[DEFAULT_DB_ALIAS]
    if slug is None or db.vendor != "postgresql" or not ONE_STATEMENT:
        return _read_orm(key_hash, slug)
    if len(slug) > MAX_SLUG:
        return Front(_key_orm(key_hash), None)
    with db.cursor() as cursor:
        cursor.execute(_statement(), [slug, key_hash])
        row = cursor.fetchone()
    if row is None:
        return Front(None, None)
    values = iter(row)
    key, tenant, route, network, wallet = (_built(db, model, values) for model in _MODELS)
    key.tenant = tenant
    if route is not None:
        route.network = network
    return Front(key, route, wallet)


def _key_orm(key_hash: str) -> TenantApiKey | None:
    return TenantApiKey.objects.select_related("tenant").filter(key_hash=key_hash, revoked_at__isnull=True).first()


def _read_orm(key_hash: str, slug: str | None) -> Front:
    key = _key_orm(key_hash)
    if key is None or slug is None or len(slug) > MAX_SLUG:
        return Front(key, None)
    route = PricedRoute.objects.select_related("network").filter(slug=slug, active=True).first()
    wallet = None if route is None else LedgerAccount.objects.filter(
        kind=AccountKind.WALLET, tenant_id=key.tenant_id, currency=route.currency).first()
    return Front(key, route, wallet)


_MODELS: tuple[type[Model], ...] = (TenantApiKey, Tenant, PricedRoute, ChainNetwork, LedgerAccount)


def _built(db: BaseDatabaseWrapper, model: type[Model], values: Iterator[object]) -> Model | None:
    """The next row of `model` from `values` (its concrete fields, in order), each value converted
    as the ORM converts it (a JSON field's text parsed...); None: a LEFT JOIN's nulls."""
    count, pk_at, attnames, converting = _layout(db.alias, model)
    taken = list(islice(values, count))
    if taken[pk_at] is None:
        return None
    for n, expression, converters in converting:
        for converter in converters:
            taken[n] = converter(taken[n], expression, db)
    return model.from_db(db.alias, attnames, taken)


Layout = tuple[int, int, list[str], list[tuple[int, Col, list[Callable]]]]


@cache
def _layout(alias: str, model: type[Model]) -> Layout:
    """(the model's concrete field count, its primary key's place, their attnames, and per field
    that has any, the backend's and the field's converters as the ORM's compiler applies them),
    worked out once: the front read runs on every priced call."""
    db = connections[alias]
    fields = model._meta.concrete_fields
    converting = []
    for n, field in enumerate(fields):
        expression = field.get_col(model._meta.db_table)
        converters = [*db.ops.get_db_converters(expression), *field.get_db_converters(db)]
        if converters:
            converting.append((n, expression, converters))
    return len(fields), fields.index(model._meta.pk), [f.attname for f in fields], converting


@cache
def _statement() -> str:
    """SELECT key, tenant, route, network, wallet (each model's concrete columns, in order); the
    route, network and wallet LEFT JOINed so a live key with no such route is still one row.
    Parameters: slug, digest."""
    qn = connections[DEFAULT_DB_ALIAS].ops.quote_name

    def columns(alias: str, model: type[Model]) -> str:
        return ", ".join(f"{alias}.{qn(f.column)}" for f in model._meta.concrete_fields)

    def table(model: type[Model]) -> str:
        return qn(model._meta.db_table)

    def column(model: type[Model], name: str) -> str:
        return qn(model._meta.get_field(name).column)

    return (f"SELECT {columns('k', TenantApiKey)}, {columns('t', Tenant)}, {columns('r', PricedRoute)}, "
            f"{columns('n', ChainNetwork)}, {columns('w', LedgerAccount)} "
            f"FROM {table(TenantApiKey)} k "
            f"JOIN {table(Tenant)} t ON t.{column(Tenant, 'id')} = k.{column(TenantApiKey, 'tenant')} "
            f"LEFT JOIN {table(PricedRoute)} r ON r.{column(PricedRoute, 'slug')} = %s "
            f"AND r.{column(PricedRoute, 'active')} "
            f"LEFT JOIN {table(ChainNetwork)} n ON n.{column(ChainNetwork, 'id')} = r.{column(PricedRoute, 'network')} "
            # A literal kind: the one-wallet-per-(tenant, currency) index is partial on it.
            f"LEFT JOIN {table(LedgerAccount)} w ON w.{column(LedgerAccount, 'tenant')} = t.{column(Tenant, 'id')} "
            f"AND w.{column(LedgerAccount, 'currency')} = r.{column(PricedRoute, 'currency')} "
            f"AND w.{column(LedgerAccount, 'kind')} = '{AccountKind.WALLET.value}' "
            f"WHERE k.{column(TenantApiKey, 'key_hash')} = %s AND k.{column(TenantApiKey, 'revoked_at')} IS NULL")
