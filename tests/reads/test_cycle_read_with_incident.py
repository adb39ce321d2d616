"""`cycle_read_with_incident` (dunning.reads.cycles): the grace sweep's read of a claimed cycle,
the same row `cycle_read` loads and the incident `active_incident` finds for its subscription's
cohort, in one statement on PostgreSQL; the two reads themselves for the embedded SQLite demo."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from dunning.acceptance.guards import active_incident
from dunning.models import DunningCycle, IncidentSwitch
from dunning.reads.cycles import cycle_read, cycle_read_with_incident
from tests.reads.test_cycle_read_for_invoice import _values
from tests.support.builders import make_subscription, open_cycle
from tests.support.paths import Walker


def _read(pk: int) -> tuple[DunningCycle, IncidentSwitch | None]:
    with CaptureQueriesContext(connection) as queries:
        cycle, incident = cycle_read_with_incident(pk)
    assert len(queries.captured_queries) == 1
    alone = cycle_read(pk)
    assert _values(cycle) == _values(alone)
    for related in ("invoice", "subscription"):
        assert _values(getattr(cycle, related)) == _values(getattr(alone, related))
    expected = active_incident(alone.subscription.cohort)
    assert (incident is None and expected is None) or _values(incident) == _values(expected)
    return cycle, incident


def _switch(cohort: str, minutes_ago: int, **fields: object) -> IncidentSwitch:
    return IncidentSwitch.objects.create(cohort=cohort, reason="r", ticket=f"INC-{cohort}-{minutes_ago}",
                                         started_at=timezone.now() - timedelta(minutes=minutes_ago), **fields)


def test_the_cycle_and_the_incident_as_the_two_reads_find_them(policy):
    cycle = Walker(open_cycle(make_subscription())).to_grace().cycle
    cohort = cycle.subscription.cohort
    assert _read(cycle.pk)[1] is None
    _switch(cohort, 50, ended_at=timezone.now())  # ended
    _switch(cohort, 45, pause_restrictions=False)  # does not pause
    _switch(f"not-{cohort}", 40)  # another cohort
    assert _read(cycle.pk)[1] is None
    _switch("*", 20)
    assert _read(cycle.pk)[1].ticket == "INC-*-20"
    _switch(cohort, 30)
    assert _read(cycle.pk)[1].ticket == f"INC-{cohort}-30"  # the earliest active one


def test_no_cycle_raises_and_the_embedded_database_takes_the_two_reads(policy, monkeypatch):
    cycle = open_cycle(make_subscription())
    _switch("*", 5)
    with pytest.raises(DunningCycle.DoesNotExist):
        cycle_read_with_incident(cycle.pk + 1000)
    monkeypatch.setattr(connections["default"], "vendor", "sqlite")
    with CaptureQueriesContext(connection) as queries:
        read, incident = cycle_read_with_incident(cycle.pk)
    monkeypatch.undo()
    assert len(queries.captured_queries) == 2 and read.pk == cycle.pk and incident.ticket == "INC-*-5"
    assert all("LATERAL" not in q["sql"] for q in queries.captured_queries)
