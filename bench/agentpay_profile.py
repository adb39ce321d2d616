"""``python -m bench.agentpay_profile --count N --profile FILE --api-key ak_… [--route SLUG --status 402]``: N calls
through the gateway (middleware, view, services, the upstream on loopback) in this one process,
back to back, timed (wall and this process's CPU); then N more under pyinstrument. The work a
gunicorn worker does per call, without the HTTP server, the load generator or queueing.
DATABASE_URL from the environment.

Prints one ``RESULT <json>`` line: calls, wall seconds (unprofiled), ms and CPU ms each (this process's,
and its PostgreSQL backend's, read from /proc: the bench runs the database on this machine),
statements each.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.agentpay_profile")
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--profile", required=True)
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--route", default="bench", help="the priced route's slug")
    parser.add_argument("--status", type=int, default=200, help="the answer each call must get (402: unpaid)")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    import logging

    logging.disable(logging.INFO)
    from django.test import Client
    from pyinstrument import Profiler

    client = Client(HTTP_HOST="127.0.0.1")
    tag = uuid.uuid4().hex[:8]

    def call(i: int) -> None:
        response = client.post(f"/agentpay/v1/routes/{args.route}/run", data=json.dumps({"q": i}).encode(),
                               content_type="application/json", HTTP_IDEMPOTENCY_KEY=f"prof-{tag}-{i}",
                               HTTP_AUTHORIZATION=f"Bearer {args.api_key}")
        if response.status_code != args.status:
            raise SystemExit(f"call {i} answered {response.status_code}: {response.content[:300]!r}")

    for i in range(20):
        call(-1 - i)
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        call(-100)
    queries = len(captured.captured_queries)
    with open(args.profile.replace("_profile.txt", "_queries.sql"), "w") as fh:
        fh.writelines(f"-- {q['time']} s\n{q['sql']};\n" for q in captured.captured_queries)
    from bench.sweep_worker import _backend_cpu_seconds
    from config.startup_heap import freeze_startup_heap

    freeze_startup_heap()  # as the gunicorn and Celery processes it stands for do (config/startup_heap.py)

    with connection.cursor() as cursor:  # the calls' one connection (this thread's), kept across requests
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]
    began, cpu_began, db_began = time.perf_counter(), time.process_time(), _backend_cpu_seconds(backend)
    for i in range(args.count):
        call(i)
    wall, cpu = time.perf_counter() - began, time.process_time() - cpu_began
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        # DB_CONN_MAX_AGE may have replaced the connection meanwhile: then the backend's CPU is unknown.
        db_cpu = _backend_cpu_seconds(backend) - db_began if cursor.fetchone()[0] == backend else None
    profiler = Profiler(interval=0.0005)
    profiler.start()
    for i in range(args.count, 2 * args.count):
        call(i)
    profiler.stop()
    with open(args.profile, "w") as fh:
        fh.write(profiler.output_text(unicode=False, color=False))
    print("RESULT " + json.dumps({"calls": args.count, "wall_seconds": wall, "ms_per_call": 1000 * wall / args.count,
                                  "cpu_ms_per_call": 1000 * cpu / args.count,
                                  "db_cpu_ms_per_call": None if db_cpu is None else 1000 * db_cpu / args.count,
                                  "queries_per_call": queries}),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
