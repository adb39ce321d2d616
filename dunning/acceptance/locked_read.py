"""What one acceptance reads (SPEC §6), in two hand-written statements sent in one round trip.

The ORM's three reads (the subscription lock, the cycle lock with its invoice, the other cycles'
views) and the rollout stage cost four round trips and most of an acceptance's Python: Django
compiled and loaded each one every time. Here:

1. LOCK_SQL locks the cycle's subscription, the cycle and its invoice, FOR UPDATE OF s, c, i.
   PostgreSQL locks the rows of one result row in the order of the OF list, so this keeps the
   order every acceptance keeps (subscription, then cycle, then invoice; see deadlocks.py).
   It reads only the locked tables: after waiting for a lock, PostgreSQL re-reads the newest
   version of a locked row, but a joined row it did not lock would come from the snapshot taken
   before the wait.
2. DECIDE_SQL runs after 1 holds its locks, so under READ COMMITTED its snapshot sees every
   acceptance committed before: the subscription's delinquent cycles (every cycle writer holds
   the subscription lock, so none moves under us), the policies' digests (what `policy_spec`
   keys its cache on) and the subscription's rollout stage (what `effective_stage` reads).
   Reading the other cycles in statement 1 would be wrong: a concurrent acceptance we waited
   for may have moved them.

   DECIDE_SQL also carries what the guards of one step would each have asked for in a round
   trip of their own: PostgreSQL's clock (`clock_timestamp()`, read once the locks are held:
   what `now_is_not_ahead` compares against under a `clock: DATABASE` policy) and the incident
   that pauses restrictions for the subscription's cohort (`active_incident`'s read, which
   begin_restriction, request_cancellation and cancel check). Both on every row, the same.

Both go in one psycopg pipeline with the transaction's BEGIN: one round trip for all three.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from django.db import connection
from django.db.models import Model, Subquery

from dunning.acceptance.aggregate import CycleView
from dunning.models import DunningCycle, DunningPolicy, IncidentSwitch
from dunning.policy.cache import policy_spec, spec_only_policy
from dunning.policy.rollout import Stage, stage_from_row
from dunning.states import DELINQUENT_STATES
from subscriptions.models import Invoice, Subscription

LOCK_SQL = """
SELECT {subscription}, {cycle}, {invoice}
FROM dunning_dunningcycle c
JOIN subscriptions_subscription s ON s.id = c.subscription_id
JOIN subscriptions_invoice i ON i.id = c.invoice_id
WHERE c.id = %(cycle)s
FOR UPDATE OF s, c, i
"""

# One row per delinquent cycle of the subscription, and one for the changed cycle whatever its
# state (its policy digest; its view is built from the row in memory, as the edge leaves it).
DECIDE_SQL = """
SELECT c.id, c.cycle_id, c.generation, c.state, c.dispute_reopened, c.exception_profile,
       c.conflict_held_profile, i.status, c.policy_id, cp.digest,
       sp.digest, r.id, r.mode, r.percent, r.started_at, clock_timestamp(), {incident}
FROM subscriptions_subscription s
JOIN dunning_dunningpolicy sp ON sp.id = s.policy_id
JOIN dunning_dunningcycle c ON c.subscription_id = s.id AND (c.id = %(cycle)s OR c.state = ANY(%(delinquent)s))
JOIN subscriptions_invoice i ON i.id = c.invoice_id
JOIN dunning_dunningpolicy cp ON cp.id = c.policy_id
LEFT JOIN LATERAL (
    SELECT r.id, r.mode, r.percent, r.started_at
    FROM dunning_rolloutstage r JOIN dunning_dunningpolicy rp ON rp.id = r.policy_id
    WHERE rp.identity = sp.identity AND r.cohort IN (s.cohort, '*')
    ORDER BY r.started_at DESC, r.id DESC LIMIT 1
) r ON true
LEFT JOIN LATERAL ({active_incident}) x ON true
WHERE s.id = (SELECT subscription_id FROM dunning_dunningcycle WHERE id = %(cycle)s)
"""
# The incident that pauses restrictions for `{cohort}` (dunning.acceptance.guards.active_incident
# reads it by itself; DECIDE_SQL for the locked subscription's cohort): the earliest active one,
# the cohort's own or "*".
ACTIVE_INCIDENT_SQL = """
SELECT {columns} FROM dunning_incidentswitch x
WHERE x.ended_at IS NULL AND x.pause_restrictions AND x.cohort IN ('*', {cohort})
ORDER BY x.started_at, x.id LIMIT 1
"""

DELINQUENT = sorted(DELINQUENT_STATES)


@dataclass(frozen=True)
class _Loader:
    """Builds model instances from a slice of a result row, as the ORM would (its converters)."""

    model: type[Model]
    alias: str
    attnames: tuple[str, ...]
    converters: tuple[tuple[int, Callable[..., Any], Any], ...]

    @property
    def columns(self) -> str:
        return ", ".join(f"{self.alias}.{connection.ops.quote_name(name)}" for name in self.attnames)

    def load(self, row: Sequence[Any]) -> Model:
        values = list(row)
        for index, convert, expression in self.converters:
            values[index] = convert(values[index], expression, connection)
        return self.model.from_db(connection.alias, self.attnames, values)


@cache
def row_loader(model: type[Model], alias: str, but: tuple[str, ...] = ()) -> _Loader:
    """Columns and converters of `model` as `alias` in a hand-written read; `but`: fields left deferred."""
    fields = [f for f in model._meta.concrete_fields if f.attname not in but]
    converters = []
    for index, field in enumerate(fields):
        column = field.get_col(alias)
        for convert in connection.ops.get_db_converters(column) + column.get_db_converters(connection):
            converters.append((index, convert, column))
    return _Loader(model, alias, tuple(f.attname for f in fields), tuple(converters))


@cache
def _lock_sql() -> str:
    return LOCK_SQL.format(subscription=row_loader(Subscription, "s").columns,
                           cycle=row_loader(DunningCycle, "c").columns, invoice=row_loader(Invoice, "i").columns)


def active_incident_sql(cohort: str) -> str:
    """ACTIVE_INCIDENT_SQL with every column of the switch, for `cohort` (an SQL expression)."""
    return ACTIVE_INCIDENT_SQL.format(columns=row_loader(IncidentSwitch, "x").columns, cohort=cohort)


@cache
def _decide_sql() -> str:
    return DECIDE_SQL.format(incident=row_loader(IncidentSwitch, "x").columns,
                             active_incident=active_incident_sql("s.cohort").strip())


_CLOCK = 15  # DECIDE_SQL's clock_timestamp(); the incident's columns follow it


def _policy(pk: int, digest: str) -> DunningPolicy:
    """The policy as `policy_spec` reads it on a cache hit (pk and digest; the rest deferred)."""
    return DunningPolicy.from_db(connection.alias, ("id", "digest"), (pk, digest))


@dataclass(frozen=True)
class LockedRead:
    subscription: Subscription
    cycle: DunningCycle  # with its invoice, policy and subscription attached
    # The subscription's other delinquent cycles as stored, and its rollout stage (what
    # `effective_stage` reads); None where settlement reads them itself (the ORM path).
    others: tuple[CycleView, ...] | None
    stage: Stage | None
    # PostgreSQL's clock once the locks were held, and the incident pausing restrictions for the
    # subscription's cohort (None: there is none); `incident_read` is False where the guards read
    # them themselves (the ORM path).
    database_clock: datetime | None = None
    incident: IncidentSwitch | None = None
    incident_read: bool = False


def lock_and_read(cycle_pk: int) -> LockedRead:
    """Inside the acceptance transaction: lock, then read what the decision needs. Raises
    DunningCycle.DoesNotExist when there is no such cycle."""
    if connection.vendor != "postgresql":
        return _orm_lock_and_read(cycle_pk)
    params = {"cycle": cycle_pk, "delinquent": DELINQUENT}
    # Errors surface at the fetch, outside Django's cursor: wrapped so a deadlock is still the
    # OperationalError `retry_on_deadlock` knows. The cursors open the connection before the pipeline.
    with (connection.wrap_database_errors, connection.cursor() as lock, connection.cursor() as decide,
          connection.connection.pipeline()):
        lock.execute(_lock_sql(), params)
        decide.execute(_decide_sql(), params)
        locked = lock.fetchone()
        rows = decide.fetchall()
    if locked is None:
        raise DunningCycle.DoesNotExist(f"no dunning cycle {cycle_pk}")
    n_sub, n_cycle = len(row_loader(Subscription, "s").attnames), len(row_loader(DunningCycle, "c").attnames)
    subscription = row_loader(Subscription, "s").load(locked[:n_sub])
    cycle = row_loader(DunningCycle, "c").load(locked[n_sub:n_sub + n_cycle])
    cycle.invoice = row_loader(Invoice, "i").load(locked[n_sub + n_cycle:])
    cycle.subscription = subscription
    first = rows[0]
    subscription.policy = _policy(subscription.policy_id, first[10])
    spec = policy_spec(subscription.policy)
    others = []
    for pk, cycle_id, generation, state, reopened, exception, held, status, policy_id, digest, *_ in rows:
        if pk == cycle_pk:
            cycle.policy = _policy(policy_id, digest)
            continue
        others.append(CycleView(
            cycle_id=str(cycle_id), generation=generation, state=state, invoice_status=status,
            dispute_reopened=reopened, exception_profile=exception, conflict_held_profile=held,
            spec=policy_spec(_policy(policy_id, digest)),
        ))
    stage_row = first[11:15] if first[11] is not None else None
    incident_row = first[_CLOCK + 1:]
    incident = row_loader(IncidentSwitch, "x").load(incident_row) if incident_row[0] is not None else None
    return LockedRead(subscription=subscription, cycle=cycle, others=tuple(others),
                      stage=stage_from_row(spec, subscription.cohort, stage_row),
                      database_clock=first[_CLOCK], incident=incident, incident_read=True)


def _orm_lock_and_read(cycle_pk: int) -> LockedRead:
    """The same locks through the ORM, for the embedded SQLite demo (one writer; no FOR UPDATE OF,
    no LATERAL, no pipeline): the subscription first, then the cycle with its invoice."""
    owner = DunningCycle.objects.filter(pk=cycle_pk).values("subscription_id")[:1]
    try:
        subscription = (Subscription.objects.select_for_update(of=("self",)).select_related("policy")
                        .defer(*spec_only_policy("policy")).get(pk=Subquery(owner)))
    except Subscription.DoesNotExist:
        raise DunningCycle.DoesNotExist(f"no dunning cycle {cycle_pk}") from None
    cycle = (DunningCycle.objects.select_for_update(of=("self", "invoice")).select_related("invoice", "policy")
             .defer(*spec_only_policy("policy")).get(pk=cycle_pk))
    cycle.subscription = subscription
    return LockedRead(subscription=subscription, cycle=cycle, others=None, stage=None)
