"""psycopg's cache of converted statements holds the acceptance's own writes (dunning.psycopg_cache):
a grace sweep's three-step acceptance, taken a second time, converts none of its statements again.
psycopg left statements over 4,096 bytes or 50 parameters out of its cache, and the cycle write
and the settlement writes are over both."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from psycopg import _queries

from dunning.psycopg_cache import STATEMENT_LENGTH, STATEMENT_PARAMS, widen_statement_cache
from tests.acceptance.test_steps import _in_one_call, _steps
from tests.support.builders import make_subscription, open_cycle, reload
from tests.support.paths import Walker


def test_the_limits_are_raised_at_start_and_never_lowered(monkeypatch):
    assert (_queries.MAX_CACHED_STATEMENT_LENGTH, _queries.MAX_CACHED_STATEMENT_PARAMS) == (
        STATEMENT_LENGTH, STATEMENT_PARAMS)  # by the app's ready()
    monkeypatch.setattr(_queries, "MAX_CACHED_STATEMENT_PARAMS", STATEMENT_PARAMS * 2)
    widen_statement_cache()
    assert _queries.MAX_CACHED_STATEMENT_PARAMS == STATEMENT_PARAMS * 2


def test_a_second_restriction_converts_no_statement_again(policy, monkeypatch):
    cycles = [reload(Walker(open_cycle(make_subscription())).to_grace().cycle) for _ in range(2)]
    now = max(c.grace_expires_at for c in cycles) + timedelta(seconds=1)
    results = _in_one_call(cycles[0], _steps(cycles[0], now), now)  # warms the cache: every statement's shape
    assert [r.accepted for r in results] == [True] * 3
    converted: list[bytes] = []
    uncached = _queries._query2pg_client_nocache

    def spy(query: bytes, encoding: str) -> Any:
        converted.append(query)
        return uncached(query, encoding)

    monkeypatch.setattr(_queries, "_query2pg_client_nocache", spy)  # what psycopg calls past its limits
    results = _in_one_call(cycles[1], _steps(cycles[1], now), now)
    assert [r.accepted for r in results] == [True] * 3
    assert converted == []
