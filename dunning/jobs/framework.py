"""What every scheduled job shares: a recorded run and streaming over due rows in due order
(the claims that hold across workers are in dunning.claims).

A job is a function `fn(run: JobReport) -> None` that reads `run.now` (never the wall clock)
and counts what it examined, changed, refused and failed on. `job_run` records each run as a
JobRun row, so an engineer can see when a job last ran and what it did; a job that raises is
recorded FAILED and the exception propagates.
"""

from __future__ import annotations

import logging
import os
import socket
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from functools import wraps
from typing import Any

from django.conf import settings
from django.db.models import Q, QuerySet

from dunning.claims import claim
from dunning.clock import now_is_not_ahead, trusted_now
from dunning.models import JobRun

log = logging.getLogger(__name__)
Progress = Callable[[str], None]


def job_setting(name: str, default: Any) -> Any:
    """A job's tunable from the settings (DUNNING_*), `default` when it is not set."""
    return getattr(settings, name, default)


@dataclass
class JobReport:
    job: str
    now: datetime
    examined: int = 0
    changed: int = 0
    refused: int = 0
    errors: int = 0
    notes: list[str] = field(default_factory=list)
    progress: Progress | None = None

    def note(self, text: str) -> None:
        if len(self.notes) < 200:
            self.notes.append(text)

    def absorb(self, part: JobReport) -> None:
        """Add the counts and notes of a part of this run worked elsewhere (a row on a thread)."""
        self.changed += part.changed
        self.refused += part.refused
        self.errors += part.errors
        for text in part.notes:
            self.note(text)

    def tick(self, every: int = 500) -> None:
        if self.progress and self.examined and self.examined % every == 0:
            self.progress(f"{self.job}: {self.examined} examined, {self.changed} changed, "
                          f"{self.refused} refused, {self.errors} errors")

    @property
    def status(self) -> str:
        return "PARTIAL" if self.errors else "OK"


JobFunction = Callable[[JobReport], None]


@dataclass(frozen=True)
class Job:
    name: str
    fn: JobFunction
    description: str


JOBS: dict[str, Job] = {}


def scheduled_job(name: str, description: str) -> Callable[[JobFunction], JobFunction]:
    def register(fn: JobFunction) -> JobFunction:
        JOBS[name] = Job(name=name, fn=fn, description=description)
        return fn

    return register


def one_worker_at_a_time(claim_name: str, what: str) -> Callable[[JobFunction], JobFunction]:
    """For a job that sweeps everything in one go: the run holds the job-wide claim (`claim_name`,
    row 0); while another worker holds it the run does nothing and says so, counted as a refusal."""

    def wrap(fn: JobFunction) -> JobFunction:
        @wraps(fn)
        def run_alone(run: JobReport) -> None:
            with claim(claim_name, 0) as got:
                if not got:
                    run.refused += 1
                    run.note(f"another worker is running {what}; skipped")
                    return
                fn(run)

        return run_alone

    return wrap


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def ahead_of_the_clock(run: JobReport) -> bool:
    """True (and noted as a refusal) when the run's `now` is ahead of the trusted clock. A job that
    acts on time itself rather than through a time-guarded edge (reminders, retry dispatch) asks
    this first: a catch-up may act at a past `now`, never at one the clock has not reached."""
    ok, clock = now_is_not_ahead(run.now, "DATABASE")
    if not ok:
        run.refused += 1
        run.note(f"refused: asked at {run.now.isoformat()}, the trusted clock reads {clock.isoformat()}")
    return not ok


def job_run(name: str, *, now: datetime | None = None, progress: Progress | None = None) -> JobRun:
    """Run one job once for the trusted `now` and record the run (the jobs are registered by
    dunning.jobs.catalog, which the app loads when Django starts)."""
    if name not in JOBS:
        raise KeyError(f"unknown job {name!r}; known: {', '.join(sorted(JOBS))}")
    now = now or trusted_now()
    record = JobRun.objects.create(job=name, run_for=now, started_at=trusted_now(), worker=worker_name())
    report = JobReport(job=name, now=now, progress=progress)
    try:
        JOBS[name].fn(report)
    except Exception:
        _finish(record, report, "FAILED", traceback.format_exc()[-4000:])
        raise
    _finish(record, report, report.status, "\n".join(report.notes))
    return record


def _finish(record: JobRun, report: JobReport, status: str, detail: str) -> None:
    record.finished_at = trusted_now()
    record.status = status
    record.examined, record.changed = report.examined, report.changed
    record.refused, record.errors = report.refused, report.errors
    record.detail = detail[:20000]
    record.save(update_fields=["finished_at", "status", "examined", "changed", "refused", "errors", "detail"])
    log.info("job %s for %s: %s", report.job, report.now.isoformat(), status)


def due_page(queryset: QuerySet, due_field: str, after: tuple[Any, int] | None = None, *,
             batch: int = 500) -> QuerySet:
    """One keyset page of (due, pk) pairs from `queryset` in (due, pk) order, after the pair `after`."""
    if after is not None:
        due, pk = after
        # The redundant `due >= last` bound is what the index can use: without it every page
        # re-walks the rows already swept and filters them out, and a sweep grows quadratically.
        queryset = queryset.filter(Q(**{f"{due_field}__gte": due}),
                                   Q(**{f"{due_field}__gt": due}) | Q(**{due_field: due, "pk__gt": pk}))
    return queryset.order_by(due_field, "pk").values_list(due_field, "pk")[:batch]


def due_in_order(queryset: QuerySet, due_field: str, *, batch: int = 500) -> Iterator[int]:
    """Primary keys of `queryset` in (due, pk) order, fetched in keyset pages so a sweep over
    100k rows neither loads them all nor holds a cursor open across acceptance calls."""
    last: tuple[Any, int] | None = None
    while True:
        rows = list(due_page(queryset, due_field, last, batch=batch))
        if not rows:
            return
        for _, pk in rows:
            yield pk
        last = rows[-1]
