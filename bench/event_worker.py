"""``python -m bench.event_worker --profile FILE``: process every PENDING provider event in this
process, one after another — the work a Celery worker does per `invoice.paid` in the restore phase
(the task's claim, fresh fetch from the simulator, evidence, acceptance, FULL snapshot), without
the broker. After 5 not timed, half of the rest is timed without the profiler (wall and CPU ms per
event, statements sent to PostgreSQL per event, the claim's included); the other half runs under
pyinstrument, which slows what it samples. DATABASE_URL and STRIPE_API_BASE come from the environment.

Prints one ``RESULT <json>`` line: events timed, their wall seconds, CPU and statements per event,
events profiled, outcomes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from typing import Any


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.event_worker")
    parser.add_argument("--profile", required=True)
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    import psycopg
    from pyinstrument import Profiler

    from dunning.models import ProviderEvent
    from dunning.models.evidence import EventOutcome
    from dunning.tasks import process_provider_event

    statements = [0]
    execute = psycopg.Cursor.execute

    def counted(cursor: Any, *a: Any, **kw: Any) -> Any:
        statements[0] += 1
        return execute(cursor, *a, **kw)

    psycopg.Cursor.execute = counted  # ClientCursor (Django's) included
    pending = list(ProviderEvent.objects.filter(outcome=EventOutcome.PENDING).order_by("pk")
                   .values_list("pk", flat=True))
    warm, rest = pending[:5], pending[5:]  # first connections, imports and caches: not timed
    timed, profiled = rest[:len(rest) // 2], rest[len(rest) // 2:]
    outcomes: Counter[str] = Counter()
    for pk in warm:
        outcomes[process_provider_event(pk)] += 1
    from config.startup_heap import freeze_startup_heap

    freeze_startup_heap()  # as the gunicorn and Celery processes it stands for do (config/startup_heap.py)
    statements[0] = 0
    began, cpu_began = time.perf_counter(), time.process_time()
    for pk in timed:  # the task's body as a worker runs it: claim, then event_process
        outcomes[process_provider_event(pk)] += 1
    wall, cpu = time.perf_counter() - began, time.process_time() - cpu_began
    sent = statements[0]
    profiler = Profiler(interval=0.001)
    profiler.start()
    for pk in profiled:
        outcomes[process_provider_event(pk)] += 1
    profiler.stop()
    with open(args.profile, "w") as fh:
        fh.write(profiler.output_text(unicode=False, color=False))
    n = max(len(timed), 1)
    print("RESULT " + json.dumps({"events": len(timed), "wall_seconds": wall, "cpu_ms_per_event": 1000 * cpu / n,
                                  "statements_per_event": sent / n, "profiled_events": len(profiled),
                                  "outcomes": outcomes}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
