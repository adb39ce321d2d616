"""Claims on one row that hold across workers: a PostgreSQL session advisory lock while one
worker works on the row. The jobs, the event task and the entitlement push take them (moved from
dunning.jobs.framework, so a service can claim a row without importing the jobs)."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection


def _lock_key(job: str) -> int:
    return zlib.crc32(job.encode()) - 2**31  # a signed int4, as pg_advisory_lock(int, int) wants


def claim_try(job: str, pk: int) -> bool:
    """Take the claim on (job, row) on this thread's connection; False when another session holds
    it. Every True must be matched by `claim_release` on the same connection."""
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [_lock_key(job), pk])
        return bool(cursor.fetchone()[0])


def claim_release(job: str, pk: int) -> None:
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [_lock_key(job), pk])


@contextmanager
def claim(job: str, pk: int) -> Iterator[bool]:
    """Hold a PostgreSQL session advisory lock on (job, row) while one worker works on the row.

    It spans the provider fetch and the acceptance call, which are separate transactions, so
    a second worker skips the row instead of fetching and asking again. The acceptance CAS is
    still the last word; this keeps concurrent sweeps from producing rejection noise. SQLite
    (the embedded demo) has one writer anyway.
    """
    got = claim_try(job, pk)
    try:
        yield got
    finally:
        if got:
            claim_release(job, pk)
