"""The one read of a cycle that deciding or asking for its next edge needs."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

from django.db import connection
from django.db.models import QuerySet

from dunning.acceptance.guards import active_incident
from dunning.acceptance.locked_read import active_incident_sql, row_loader
from dunning.models import DunningCycle, DunningPolicy, IncidentSwitch, PaymentAttempt
from dunning.policy.cache import POLICY_DEFERRED, deferred_policy
from subscriptions.models import Invoice, Subscription

# `cycle_read` and `cycle_read_for_invoice` by hand on PostgreSQL: the ORM compiled this
# five-table read (about 130 columns) for every paid event, a fifth of its processing, and twice
# per cycle of a grace sweep.
READ_SQL = """
SELECT {cycle}, {invoice}, {subscription}, {policy}, {attempt}{incident}
FROM dunning_dunningcycle c
JOIN subscriptions_invoice i ON i.id = c.invoice_id
JOIN subscriptions_subscription s ON s.id = c.subscription_id
JOIN dunning_dunningpolicy p ON p.id = c.policy_id
LEFT JOIN dunning_paymentattempt a ON a.id = c.pending_attempt_id{incident_join}
"""
# `cycle_read_with_incident`: the same row and the incident pausing restrictions for its
# subscription's cohort (what `active_incident` reads), in the one statement.
INCIDENT_JOIN = "\nLEFT JOIN LATERAL ({active_incident}) x ON true"
BY_PK = "WHERE c.id = %(cycle)s"
FOR_INVOICE = "WHERE i.provider = %(provider)s AND i.provider_invoice_id = %(invoice)s ORDER BY c.id LIMIT 1"
_PARTS = ((DunningCycle, "c", ()), (Invoice, "i", ()), (Subscription, "s", ()), (DunningPolicy, "p", POLICY_DEFERRED),
          (PaymentAttempt, "a", ()))


@cache
def _read_sql(where: str, incident: bool = False) -> str:
    names = ("cycle", "invoice", "subscription", "policy", "attempt")
    columns = {name: row_loader(model, alias, but).columns for name, (model, alias, but) in zip(names, _PARTS,
                                                                                                 strict=True)}
    if not incident:
        return READ_SQL.format(**columns, incident="", incident_join="") + where
    return READ_SQL.format(**columns, incident=", " + row_loader(IncidentSwitch, "x").columns,
                           incident_join=INCIDENT_JOIN.format(active_incident=active_incident_sql("s.cohort").strip())
                           ) + where


def _for_next_step() -> QuerySet[DunningCycle]:
    return (DunningCycle.objects.select_related("invoice", "policy", "subscription", "pending_attempt")
            .defer(*deferred_policy("policy")))


def cycle_read(cycle_pk: int) -> DunningCycle:
    """A cycle with what deciding its next step reads (invoice, policy, subscription, pending
    attempt); the policy's document stays deferred, its spec comes from the cache."""
    if connection.vendor != "postgresql":
        return _for_next_step().get(pk=cycle_pk)
    cycle = _read_one(BY_PK, {"cycle": cycle_pk})
    if cycle is None:
        raise DunningCycle.DoesNotExist(f"no dunning cycle {cycle_pk}")
    return cycle


def cycle_read_with_incident(cycle_pk: int) -> tuple[DunningCycle, IncidentSwitch | None]:
    """`cycle_read`, and the incident that pauses restrictions for the cycle's subscription's
    cohort (`active_incident`), in one round trip: a grace sweep asks for both before its fetch."""
    if connection.vendor != "postgresql":
        cycle = cycle_read(cycle_pk)
        return cycle, active_incident(cycle.subscription.cohort)
    with connection.cursor() as cursor:
        cursor.execute(_read_sql(BY_PK, incident=True), {"cycle": cycle_pk})
        row = cursor.fetchone()
    if row is None:
        raise DunningCycle.DoesNotExist(f"no dunning cycle {cycle_pk}")
    incident = row_loader(IncidentSwitch, "x")
    incident_row = row[len(row) - len(incident.attnames):]
    return _load(row), incident.load(incident_row) if incident_row[0] is not None else None


def cycle_read_for_invoice(provider: str, provider_invoice_id: str) -> DunningCycle | None:
    """`cycle_read` of the cycle of one provider invoice, or None: an event's processing finds
    its cycle and plans its first step from the same read."""
    if connection.vendor != "postgresql":
        return _for_next_step().filter(invoice__provider=provider,
                                       invoice__provider_invoice_id=provider_invoice_id).first()
    return _read_one(FOR_INVOICE, {"provider": provider, "invoice": provider_invoice_id})


def _read_one(where: str, params: dict[str, object]) -> DunningCycle | None:
    with connection.cursor() as cursor:
        cursor.execute(_read_sql(where), params)
        row = cursor.fetchone()
    return None if row is None else _load(row)


def _load(row: Sequence[Any]) -> DunningCycle:
    """The cycle and its related rows from READ_SQL's columns (any columns after them ignored)."""
    loaders = [row_loader(model, alias, but) for model, alias, but in _PARTS]
    parts, start = [], 0
    for loader in loaders:
        parts.append(row[start:start + len(loader.attnames)])
        start += len(loader.attnames)
    cycle_row, invoice_row, subscription_row, policy_row, attempt_row = parts
    cycle_loader, invoice_loader, subscription_loader, policy_loader, attempt_loader = loaders
    cycle = cycle_loader.load(cycle_row)
    cycle.invoice = invoice_loader.load(invoice_row)
    cycle.subscription = subscription_loader.load(subscription_row)
    cycle.policy = policy_loader.load(policy_row)
    cycle.pending_attempt = attempt_loader.load(attempt_row) if cycle.pending_attempt_id is not None else None
    return cycle
