"""The one trusted clock.

Every guard that compares against "now" (grace expiry, restriction, cancellation, exception
expiry, a contract's end) reads time here, and every job takes `now` as a parameter that
defaults to this function, so tests and catch-up runs can inject time.

A policy names its clock (`clock: DATABASE | APPLICATION`). DATABASE is PostgreSQL's
`clock_timestamp()`: one clock for every web and worker process, whatever their hosts' clocks
say. A caller's `now` may lie in the past (a catch-up run) but never after the trusted clock:
`now_is_not_ahead` is the check the acceptance service makes before any time-guarded edge.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection
from django.utils import timezone

# Two clocks read moments apart (and two hosts) differ a little; more than this is "ahead".
CLOCK_TOLERANCE = timedelta(seconds=5)


def trusted_now() -> datetime:
    return timezone.now()


def database_now() -> datetime:
    """PostgreSQL's wall clock at this instant (not the transaction's start, which `now()` gives)."""
    if connection.vendor != "postgresql":
        return timezone.now()  # the SQLite demo has one process and one clock
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def clock_source(policy_clock: str) -> str:
    """The clock actually read for a policy's `clock`. DUNNING_CLOCK_OVERRIDE (tests that move
    the application's time with time-machine, which cannot move PostgreSQL's) names one for all."""
    return getattr(settings, "DUNNING_CLOCK_OVERRIDE", "") or policy_clock


def clock_now(policy_clock: str = "APPLICATION", database_clock: datetime | None = None) -> datetime:
    """`database_clock`: PostgreSQL's clock as the caller's transaction already read it (the
    acceptance's locked read asks for it in the statement it sends anyway, which saves a round trip)."""
    if clock_source(policy_clock) != "DATABASE":
        return trusted_now()
    return database_clock if database_clock is not None else database_now()


def now_is_not_ahead(now: datetime, policy_clock: str, database_clock: datetime | None = None
                     ) -> tuple[bool, datetime]:
    """(whether `now` is at or before the trusted clock, allowing CLOCK_TOLERANCE; the clock read)."""
    clock = clock_now(policy_clock, database_clock)
    return now <= clock + CLOCK_TOLERANCE, clock
