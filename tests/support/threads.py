"""Races: calls started on their own threads and released together on a barrier."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from django.db import connections

_NOT_DONE = object()


def run_together(calls: Sequence[Callable[[], Any]], *, timeout: float = 30.0, errors: str = "raise",
                 barrier_timeout: float | None = 10.0) -> list[Any]:
    """Run each call on its own thread, all released at once by a barrier, and wait for them.

    Returns the calls' results in the order of `calls`. A call that raised stands in the list as
    its exception with `errors="return"`; with `errors="raise"` (the default) any exception fails
    the race with all of them listed. A thread still running after `timeout` seconds (each
    thread is waited for that long, one after the other) fails it too. Each thread closes its
    own database connections when it ends: every thread has its own connection, so the calls
    run on separate PostgreSQL sessions."""
    if errors not in ("raise", "return"):
        raise ValueError(f"errors must be 'raise' or 'return', not {errors!r}")
    barrier = threading.Barrier(len(calls))
    outcomes: list[Any] = [_NOT_DONE] * len(calls)

    def run(i: int, call: Callable[[], Any]) -> None:
        try:
            barrier.wait(timeout=barrier_timeout)
            outcomes[i] = call()
        except Exception as exc:  # kept in its place; a thread must not die silently
            outcomes[i] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i, call), daemon=True) for i, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)
    hung = [i for i, thread in enumerate(threads) if thread.is_alive()]
    assert not hung, f"calls {hung} still running after {timeout}s"
    if errors == "raise":
        raised = [o for o in outcomes if isinstance(o, Exception)]
        assert not raised, raised
    return outcomes
