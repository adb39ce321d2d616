"""psycopg's cache of converted statements, widened to hold the hand-written acceptance writes.

psycopg turns each statement's `%s` / `%(name)s` placeholders into its own template by a regex
walk of the whole text, and caches the result (an LRU of 128 by statement text) only for
statements under 4,096 bytes *and* 50 parameters (psycopg/_queries.py MAX_CACHED_STATEMENT_LENGTH,
MAX_CACHED_STATEMENT_PARAMS, read at each execute). The statements that end an acceptance
(dunning.acceptance.cycle_writes: the cycle UPDATE with one history row per step, about 190
parameters for a grace sweep's three steps; dunning.acceptance.settlement_writes: receipt,
snapshot, subscription and outbox rows) are over both, so every execute walked them again:
2 per grace sweep cycle, the largest single item of the job's own CPU in a cProfile of 300 cycles.
Their text is fixed per shape (each builder caches it), so the cache holds a handful of entries.
The same limits guard the server-side binding path (PostgresQuery), so this holds either way.
"""

from __future__ import annotations

from psycopg import _queries

# Above the largest statement the product sends per shape (a few tens of KB at most).
STATEMENT_LENGTH = 64 * 1024
STATEMENT_PARAMS = 2000


def widen_statement_cache() -> None:
    """Raise psycopg's limits (never lower them); idempotent."""
    _queries.MAX_CACHED_STATEMENT_LENGTH = max(_queries.MAX_CACHED_STATEMENT_LENGTH, STATEMENT_LENGTH)
    _queries.MAX_CACHED_STATEMENT_PARAMS = max(_queries.MAX_CACHED_STATEMENT_PARAMS, STATEMENT_PARAMS)
