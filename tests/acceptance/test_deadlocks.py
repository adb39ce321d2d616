"""Deadlock victims are retried; other database errors are not."""

from __future__ import annotations

import pytest
from django.db import OperationalError

from dunning.acceptance.deadlocks import DEADLOCK_RETRIES, retry_on_deadlock


class _Cause(Exception):
    def __init__(self, sqlstate: str) -> None:
        super().__init__(sqlstate)
        self.sqlstate = sqlstate


def _error(sqlstate: str) -> OperationalError:
    error = OperationalError("boom")
    error.__cause__ = _Cause(sqlstate)
    return error


def test_a_deadlock_victim_is_run_again():
    calls = []

    def work():
        calls.append(1)
        if len(calls) < 3:
            raise _error("40P01")
        return "done"

    assert retry_on_deadlock(work, what="test") == "done" and len(calls) == 3


def test_other_errors_and_endless_deadlocks_are_raised():
    calls = []

    def other():
        calls.append(1)
        raise _error("08006")

    with pytest.raises(OperationalError):
        retry_on_deadlock(other, what="test")
    assert len(calls) == 1

    def always():
        raise _error("40P01")

    with pytest.raises(OperationalError):
        retry_on_deadlock(always, what="test")
    assert DEADLOCK_RETRIES >= 3
