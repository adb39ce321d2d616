"""The cycle row's writes of one acceptance, in one statement at its end on PostgreSQL.

A multi-step acceptance (`cycle_accept_steps`: a job's expire_grace + begin_restriction +
complete_restriction) saved the cycle after every step: an UPDATE with the compare-and-set of
dunning.models.cycle (the generation and the state the row was loaded with) and the history row
simple_history writes after it, two statements and most of Django's save machinery per step.
The row is locked for the whole transaction, so the steps after the first compare against the
row in memory; what the database needs is the row as the last step left it and one history row
per step. Here a step stages its row (`CycleWrites.stage`, where `cycle.save()` was: its
auto_now stamp and its history row) and the end of the acceptance writes them
(`CycleWrites.flush`): one UPDATE carrying the first step's compare-and-set, and the history rows
in one multi-row INSERT (row order is step order), as data-modifying CTEs of one statement.

The values are the ones Django's save would send at each step (each field's `pre_save`, so the
`auto_now` stamp, and its database conversion) and the history rows the ones simple_history
writes (date, change reason, `~`, user: dunning.acceptance.settlement_writes' helpers). The
embedded SQLite demo, and a project with history turned off, save at each step as before.

Nothing inside an acceptance reads the cycle row back from the database between its steps (the
lock read holds it in memory; settlement gets the other cycles from that read), which is what
makes the deferral invisible; the receipts, attempts and facts of each step are still written
by the step itself.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Field
from django_fsm import ConcurrentTransition

from dunning.acceptance.settlement_writes import HISTORY_EXTRA, _history_model, _history_params
from dunning.models import DunningCycle


def _batched() -> bool:
    return connections[DEFAULT_DB_ALIAS].vendor == "postgresql" and getattr(settings, "SIMPLE_HISTORY_ENABLED", True)


class CycleWrites:
    """The cycle row of one acceptance transaction: staged after each step, written at the end."""

    def __init__(self, cycle: DunningCycle) -> None:
        self.cycle = cycle
        self.batched = _batched()
        # The compare-and-set of the first save: the row as the lock read loaded it.
        self.loaded_generation = cycle._loaded_generation
        self.loaded_state = cycle.state
        self.history: list[list[Any]] = []  # one history row per staged step

    def stage(self) -> None:
        """Where a step would `cycle.save()`: the row as it stands now (saved at once without the batch)."""
        if not self.batched:
            self.cycle.save()
            return
        db = connections[DEFAULT_DB_ALIAS]
        cycle = self.cycle
        for f in _stamping_fields():
            f.pre_save(cycle, False)  # what a save would stamp now (auto_now), which the history row records
        tracked = [f.get_db_prep_save(getattr(cycle, f.attname), db) for f in _history_fields()]
        self.history.append(tracked + _history_params(cycle, "~"))

    def flush(self) -> None:
        """Write what was staged; raises ConcurrentTransition when the row moved since it was loaded
        (it cannot while the lock is held: the compare-and-set stays the last word all the same)."""
        if not self.history:
            return
        cycle = self.cycle
        db = connections[DEFAULT_DB_ALIAS]
        # The row as the last step left it (its stamps included): only the last step's values are
        # written, so they are converted once, here, not at every step. Nothing changes the row
        # between the last stage and the flush (settlement only reads it).
        values = [f.get_db_prep_save(getattr(cycle, f.attname), db) for f in _fields()]
        params = [*values, cycle.pk, self.loaded_generation, self.loaded_state]
        for row in self.history:
            params += row
        with db.cursor() as cursor:
            cursor.execute(_statement(len(self.history)), params)
            (updated,) = cursor.fetchone()
        if not updated:
            raise ConcurrentTransition(f"cycle {cycle.pk} moved past generation {self.loaded_generation} "
                                       f"/ {self.loaded_state} since it was loaded")
        # What GenerationFenceMixin and ConcurrentTransitionMixin note after a save.
        cycle._loaded_generation = cycle.generation
        cycle._update_initial_state()
        self.history = []


@cache
def _fields() -> tuple[Field, ...]:
    return tuple(f for f in DunningCycle._meta.local_concrete_fields if not f.primary_key)


@cache
def _stamping_fields() -> tuple[Field, ...]:
    """The fields whose `pre_save` may change the instance (DateTimeField's auto_now); for every
    other field it returns the attribute as it stands."""
    return tuple(f for f in _fields() if type(f).pre_save is not Field.pre_save)


@cache
def _history_fields() -> tuple[Field, ...]:
    return tuple(_history_model(DunningCycle).tracked_fields)


@cache
def _statement(rows: int) -> str:
    """UPDATE of the row (compare-and-set on generation and state), the history rows, and the
    number of rows the UPDATE changed (0 or 1)."""
    qn = connections[DEFAULT_DB_ALIAS].ops.quote_name
    hist = _history_model(DunningCycle)
    sets = ", ".join(f"{qn(f.column)} = %s" for f in _fields())
    columns = [qn(f.column) for f in _history_fields()] + [qn(hist._meta.get_field(f).column) for f in HISTORY_EXTRA]
    row = "(" + ", ".join(["%s"] * len(columns)) + ")"
    return (f"WITH u AS (UPDATE {qn(DunningCycle._meta.db_table)} SET {sets} "
            f"WHERE {qn('id')} = %s AND {qn('generation')} = %s AND {qn('state')} = %s RETURNING 1), "
            f"h AS (INSERT INTO {qn(hist._meta.db_table)} ({', '.join(columns)}) VALUES {', '.join([row] * rows)}) "
            f"SELECT count(*) FROM u")
