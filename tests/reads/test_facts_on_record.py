"""`facts_on_record` (dunning.reads.facts): the count the ORM's `dedupe_key__in` query gives, by
hand on PostgreSQL (one short statement), the ORM's own query on SQLite."""

from __future__ import annotations

from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from dunning.models import MonetaryFact
from dunning.reads.facts import ON_RECORD_SQL, facts_on_record
from tests.support.builders import make_subscription, open_cycle
from tests.support.paths import Walker


def _orm(keys: list[str]) -> int:
    return MonetaryFact.objects.filter(dedupe_key__in=keys).count()


def test_the_count_is_the_orm_s(policy):
    walker = Walker(open_cycle(make_subscription())).to_recovered()
    recorded = list(MonetaryFact.objects.values_list("dedupe_key", flat=True))
    assert recorded, "the walk recorded the payment as a fact"
    key = recorded[0]
    for keys in ([key], [key, "failed:in_missing:1"], ["failed:in_missing:1"], [key, key], []):
        with CaptureQueriesContext(connection) as queries:
            counted = facts_on_record(keys)
        assert counted == _orm(keys), keys
        sent = [q["sql"] for q in queries.captured_queries]
        assert len(sent) == (1 if keys else 0) and all(q.startswith(ON_RECORD_SQL.split("%s")[0]) for q in sent)
    assert walker.cycle.pk


def test_the_embedded_database_takes_the_orm_query(policy, monkeypatch):
    Walker(open_cycle(make_subscription())).to_recovered()
    key = MonetaryFact.objects.values_list("dedupe_key", flat=True).first()
    monkeypatch.setattr(connections["default"], "vendor", "sqlite")
    with CaptureQueriesContext(connection) as queries:
        counted = facts_on_record([key, "failed:in_missing:1"])
    monkeypatch.undo()
    [query] = queries.captured_queries
    assert counted == 1 and '"dunning_monetaryfact"."dedupe_key" IN' in query["sql"]  # the ORM's own
