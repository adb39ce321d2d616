"""`cycle_read` (dunning.reads.cycles) by primary key: the same hand-written read as
`cycle_read_for_invoice` on PostgreSQL, loading what the ORM's select_related read loads; the
ORM's read itself for the embedded SQLite demo."""

from __future__ import annotations

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from dunning.models import DunningCycle
from dunning.policy.cache import POLICY_DEFERRED
from dunning.reads.cycles import _for_next_step, cycle_read
from tests.reads.test_cycle_read_for_invoice import _values
from tests.support.builders import local_policy, make_subscription, open_cycle
from tests.support.paths import Walker


def _same_as_the_orm(pk: int) -> DunningCycle:
    with CaptureQueriesContext(connection) as queries:
        read = cycle_read(pk)
    [query] = queries.captured_queries
    assert "LEFT JOIN dunning_paymentattempt a" in query["sql"]
    orm = _for_next_step().get(pk=pk)
    for related in ("invoice", "subscription", "pending_attempt"):
        mine, theirs = getattr(read, related), getattr(orm, related)
        assert (mine is None) == (theirs is None)
        if mine is not None:
            assert _values(mine) == _values(theirs)
    assert _values(read) == _values(orm)
    assert _values(read.policy, POLICY_DEFERRED) == _values(orm.policy, POLICY_DEFERRED)
    assert read.policy.get_deferred_fields() == set(POLICY_DEFERRED)
    assert read._loaded_generation == read.generation  # the CAS fence a later save compares against
    with CaptureQueriesContext(connection) as later:  # nothing the ORM loaded is read again on access
        read.invoice.price_ids, read.subscription.outstanding_cycle_root, read.pending_attempt  # noqa: B018
    assert later.captured_queries == []
    return read


def test_the_read_holds_what_the_orm_read_holds(policy):
    cycle = Walker(open_cycle(make_subscription())).to_grace().cycle
    read = _same_as_the_orm(cycle.pk)
    assert read.pk == cycle.pk and read.pending_attempt is None and read.state == cycle.state


def test_with_an_attempt_in_flight(db):
    local_policy()
    cycle = Walker(open_cycle(make_subscription(price="price_local"))).to_dispatching().cycle
    assert cycle.pending_attempt_id is not None
    assert _same_as_the_orm(cycle.pk).pending_attempt.pk == cycle.pending_attempt_id


def test_no_cycle_raises_and_the_embedded_database_takes_the_orm_read(policy, monkeypatch):
    cycle = open_cycle(make_subscription())
    with pytest.raises(DunningCycle.DoesNotExist):
        cycle_read(cycle.pk + 1000)
    monkeypatch.setattr(connections["default"], "vendor", "sqlite")
    with CaptureQueriesContext(connection) as queries:
        read = cycle_read(cycle.pk)
    monkeypatch.undo()
    [query] = queries.captured_queries
    assert "dunning_paymentattempt a" not in query["sql"] and read.pk == cycle.pk  # the ORM's own SQL
