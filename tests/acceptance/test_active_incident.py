"""`active_incident` (dunning.acceptance.guards): one hand-written read on PostgreSQL that finds
the incident the ORM's query finds (active, pausing restrictions, for the cohort or "*", earliest
first); the ORM's query itself for the embedded SQLite demo."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from dunning.acceptance.guards import active_incident
from dunning.models import IncidentSwitch


def _orm(cohort: str) -> IncidentSwitch | None:
    return (IncidentSwitch.objects.filter(ended_at__isnull=True, pause_restrictions=True, cohort__in=("*", cohort))
            .order_by("started_at", "pk").first())


def _values(obj: Any) -> dict[str, Any] | None:
    return None if obj is None else {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}


def _switch(cohort: str, minutes_ago: int, **fields: Any) -> IncidentSwitch:
    return IncidentSwitch.objects.create(cohort=cohort, reason="r", ticket=f"INC-{cohort}-{minutes_ago}",
                                         started_at=timezone.now() - timedelta(minutes=minutes_ago), **fields)


@pytest.mark.django_db
def test_the_read_finds_what_the_orm_finds():
    cohorts = ("eu", "us", "apac")
    assert [active_incident(c) for c in cohorts] == [None] * 3
    _switch("eu", 50, ended_at=timezone.now())  # ended
    _switch("us", 40, pause_restrictions=False)  # does not pause
    _switch("eu", 30)
    _switch("*", 20)
    _switch("eu", 10)
    for cohort in cohorts:
        with CaptureQueriesContext(connection) as queries:
            mine = active_incident(cohort)
        [query] = queries.captured_queries
        assert "FROM dunning_incidentswitch x" in query["sql"]
        assert _values(mine) == _values(_orm(cohort)) is not None
    assert active_incident("eu").ticket == "INC-eu-30" and active_incident("us").ticket == "INC-*-20"


@pytest.mark.django_db
def test_the_embedded_database_takes_the_orm_query(monkeypatch):
    _switch("*", 5)
    monkeypatch.setattr(connections["default"], "vendor", "sqlite")
    with CaptureQueriesContext(connection) as queries:
        found = active_incident("eu")
    monkeypatch.undo()
    [query] = queries.captured_queries
    assert "dunning_incidentswitch x" not in query["sql"] and found.ticket == "INC-*-5"
