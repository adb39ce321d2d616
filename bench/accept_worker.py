"""One acceptance-throughput worker (a spawned process with its own database connection).

It loops over its own cycles (no row is shared with another worker) asking the acceptance
service for `record_evidence` with an empty Evidence: the full §6 transaction (lock the
subscription and the cycle, CAS all five expectations, recompute the root and the decision,
write the TransitionReceipt) without moving the FSM, so the same expectation stays valid and
the loop can run for a fixed time.
"""

from __future__ import annotations

import os
import time
from typing import Any


def run(database_url: str, cycle_pks: list[int], ready: Any, start: Any, seconds: float, results: Any,
        profile: str = "") -> None:
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from dunning.acceptance.inputs import Cause, Expect
    from dunning.acceptance.transitions import cycle_accept_transition
    from dunning.models import DunningCycle

    cause = Cause.system("bench-acceptance")
    expects = {}
    for pk in cycle_pks:
        cycle = DunningCycle.objects.select_related("invoice", "subscription", "pending_attempt").get(pk=pk)
        expects[pk] = Expect.from_cycle(cycle)
    first = cycle_accept_transition(cycle_pk=cycle_pks[0], edge="record_evidence", expect=expects[cycle_pks[0]],
                                    cause=cause)  # warm the policy cache and the connection
    if not first.accepted:
        results.put({"error": f"record_evidence refused: {first.reason} {first.detail}"})
        return
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        cycle_accept_transition(cycle_pk=cycle_pks[0], edge="record_evidence", expect=expects[cycle_pks[0]],
                                cause=cause)
    queries = len(captured.captured_queries)
    from config.startup_heap import freeze_startup_heap

    freeze_startup_heap()  # as the gunicorn and Celery processes it stands for do (config/startup_heap.py)
    profiler = None
    if profile:  # the profiled worker also leaves the SQL of one acceptance beside its profile
        with open(profile.replace("_profile.txt", "_queries.sql"), "w") as fh:
            fh.writelines(f"-- {q['time']} s\n{q['sql']};\n" for q in captured.captured_queries)
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.001)
    ready.put(os.getpid())
    start.wait()
    if profiler is not None:
        profiler.start()
    accepted = refused = 0
    began = time.perf_counter()
    deadline = began + seconds
    i = 0
    while time.perf_counter() < deadline:
        pk = cycle_pks[i % len(cycle_pks)]
        i += 1
        result = cycle_accept_transition(cycle_pk=pk, edge="record_evidence", expect=expects[pk], cause=cause)
        if result.accepted:
            accepted += 1
        else:
            refused += 1
    elapsed = time.perf_counter() - began
    if profiler is not None:
        profiler.stop()
        with open(profile, "w") as fh:
            fh.write(profiler.output_text(unicode=False, color=False))
    results.put({"pid": os.getpid(), "accepted": accepted, "refused": refused, "seconds": elapsed,
                 "queries_per_acceptance": queries})
