"""The cycle row of an acceptance written once at its end (dunning.acceptance.cycle_writes): on
PostgreSQL one statement with the first step's compare-and-set and one history row per step; the
same row and history rows as a save after every step (the embedded demo's path)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django_fsm import ConcurrentTransition

from dunning.acceptance import cycle_writes
from dunning.acceptance.cycle_writes import CycleWrites
from dunning.models import DunningCycle
from tests.acceptance.test_steps import _in_one_call, _result_fields, _steps
from tests.support.builders import make_subscription, open_cycle, reload
from tests.support.paths import Walker

# The cycle's own identifiers and clock stamps (each twin opened and saved when it was): the rest must match.
OWN = {"id", "cycle_id", "subscription_id", "invoice_id", "updated_at", "history_id", "history_date",
       "opened_at"}


@pytest.fixture
def twins(policy):
    walkers = [Walker(open_cycle(make_subscription())).to_grace() for _ in range(2)]
    return [reload(w.cycle) for w in walkers]


def _row(obj: Any) -> dict[str, Any]:
    return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields if f.attname not in OWN}


def _history(cycle: DunningCycle, since: int) -> list[dict[str, Any]]:
    return [_row(h) for h in DunningCycle.history.filter(id=cycle.pk, history_id__gt=since).order_by("history_id")]


def _cycle_writes(queries: CaptureQueriesContext) -> list[str]:
    return [q["sql"][:40] for q in queries.captured_queries
            if '"dunning_dunningcycle"' in q["sql"] and q["sql"].lstrip().startswith(("UPDATE", "WITH"))
            or "dunning_historicaldunningcycle" in q["sql"]]


def test_one_write_at_the_end_is_a_save_after_every_step(twins, monkeypatch):
    ours, theirs = twins
    now = ours.grace_expires_at + timedelta(seconds=1)
    since = DunningCycle.history.order_by("-history_id").values_list("history_id", flat=True).first()
    with CaptureQueriesContext(connection) as batched:
        results = _in_one_call(ours, _steps(ours, now), now)
    with monkeypatch.context() as patched, CaptureQueriesContext(connection) as saved:
        patched.setattr(cycle_writes, "_batched", lambda: False)
        reference = _in_one_call(theirs, _steps(theirs, now), now)
    assert [_result_fields(r) for r in results] == [_result_fields(r) for r in reference]
    assert [r.accepted for r in results] == [True] * 3
    assert _row(reload(ours)) == _row(reload(theirs)) and reload(ours).state == "RESTRICTED"
    mine, theirs_history = _history(ours, since), _history(theirs, since)
    assert [h["state"] for h in mine] == ["GRACE_EXPIRED", "RESTRICTING", "RESTRICTED"]
    assert mine == theirs_history  # generation, state, stamps, history type, user, reason: step by step
    assert len(_cycle_writes(batched)) == 1 and len(_cycle_writes(saved)) == 6  # UPDATE + history row per step
    assert results[-1].cycle._loaded_generation == results[-1].cycle.generation  # as a save leaves it


def test_the_write_keeps_the_compare_and_set_of_the_row_as_loaded(twins):
    ours, _ = twins
    cycle = reload(ours)
    writes = CycleWrites(cycle)
    cycle.generation += 1
    writes.stage()
    DunningCycle.objects.filter(pk=cycle.pk).update(generation=cycle.generation + 5)  # moved behind its back
    with pytest.raises(ConcurrentTransition), transaction.atomic():
        writes.flush()
    assert reload(ours).generation == cycle.generation + 5


def test_a_failed_write_refuses_the_first_step_and_takes_none(twins, monkeypatch):
    ours, _ = twins
    now = ours.grace_expires_at + timedelta(seconds=1)

    def moved(self: CycleWrites) -> None:
        raise ConcurrentTransition("moved")

    monkeypatch.setattr(CycleWrites, "flush", moved)
    results = _in_one_call(ours, _steps(ours, now), now)
    assert [(r.edge, r.accepted, r.reason) for r in results] == [("expire_grace", False, "STALE_CYCLE_GENERATION")]
    assert reload(ours).state == "GRACE_ACTIVE"



def test_the_row_written_at_the_end_carries_the_last_step_s_stamp(twins):
    """Only the last step's values are converted and written (at the flush); the steps still
    stamp the row (auto_now) when staged, as their saves would have."""
    cycle = twins[0]
    now = cycle.grace_expires_at + timedelta(seconds=1)
    results = _in_one_call(cycle, _steps(cycle, now), now)
    assert all(r.accepted for r in results)
    stored = reload(cycle)
    assert stored.updated_at > cycle.updated_at and stored.updated_at == results[-1].cycle.updated_at
    assert stored.state == "RESTRICTED" and stored.generation == results[-1].cycle.generation
