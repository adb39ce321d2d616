"""``python -m bench.webhook_profile --count N --profile FILE``: N signed ``invoice.paid``
deliveries timed, then N more under pyinstrument, through the whole Django stack in this one
process, back to back: the WSGI application gunicorn calls (config.wsgi), with the environ a
gunicorn worker builds, so the request signals (close_old_connections and the connection health
check), middleware, URL resolving, view, intake, Celery hand-off to Redis and the response's close
all count: the work a gunicorn worker does per delivery in the webhook phase, without the HTTP
server, the load generator or queueing. Bodies are signed before the timed loop.
DATABASE_URL, REDIS_URL and the webhook secret come from the environment.

Prints one ``RESULT <json>`` line: deliveries, wall seconds and CPU seconds (untimed by the
profiler), ms each, and the statements sent to PostgreSQL per delivery (every one psycopg sends,
the health check's included).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from typing import Any


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.webhook_profile")
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--profile", required=True)
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    import psycopg
    from pyinstrument import Profiler

    from bench.common import ACCOUNT, SECRET
    from bench.loadgen import sign, synthetic_event
    from config.wsgi import application

    statements = [0]
    execute = psycopg.Cursor.execute

    def counted(cursor: Any, *a: Any, **kw: Any) -> Any:
        statements[0] += 1
        return execute(cursor, *a, **kw)

    psycopg.Cursor.execute = counted  # ClientCursor (Django's) and the raw cursor of the health check
    tag = f"{int(time.time() * 1000)}"
    signed = {i: _signed(synthetic_event(f"evt_prof{tag}_{i}", f"in_prof{i}", ACCOUNT), sign, SECRET)
              for i in range(-20, 2 * args.count)}

    def deliver(i: int) -> None:
        answer: list[str] = []
        body, signature = signed[i]
        result = application(_environ(body, signature), lambda status, headers, exc_info=None: answer.append(status))
        try:
            content = b"".join(result)
        finally:
            result.close()
        if not answer[0].startswith("200"):
            raise SystemExit(f"delivery {i} answered {answer[0]}: {content[:300]!r}")

    for i in range(20):  # warm: connections, caches, the broker's channel
        deliver(-1 - i)
    from config.startup_heap import freeze_startup_heap

    freeze_startup_heap()  # as the gunicorn and Celery processes it stands for do (config/startup_heap.py)
    statements[0] = 0
    began, cpu_began = time.perf_counter(), time.process_time()
    for i in range(args.count):  # timed without the profiler, which slows what it samples
        deliver(i)
    wall, cpu = time.perf_counter() - began, time.process_time() - cpu_began
    sent = statements[0]
    profiler = Profiler(interval=0.0005)
    profiler.start()
    for i in range(args.count, 2 * args.count):
        deliver(i)
    profiler.stop()
    with open(args.profile, "w") as fh:
        fh.write(profiler.output_text(unicode=False, color=False))
    print("RESULT " + json.dumps({"deliveries": args.count, "wall_seconds": wall, "cpu_seconds": cpu,
                                  "ms_per_delivery": 1000 * wall / args.count,
                                  "cpu_ms_per_delivery": 1000 * cpu / args.count,
                                  "statements_per_delivery": sent / args.count}), flush=True)
    return 0


def _signed(body: bytes, sign: Any, secret: str) -> tuple[bytes, str]:
    return body, sign(body, secret)


def _environ(body: bytes, signature: str) -> dict[str, Any]:
    """What gunicorn's worker hands the WSGI application for an aiohttp POST on a fresh connection."""
    return {
        "REQUEST_METHOD": "POST", "SCRIPT_NAME": "", "PATH_INFO": "/webhooks/stripe/", "RAW_URI": "/webhooks/stripe/",
        "QUERY_STRING": "", "SERVER_PROTOCOL": "HTTP/1.1", "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8000",
        "REMOTE_ADDR": "127.0.0.1", "REMOTE_PORT": "50000", "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(body)), "HTTP_HOST": "127.0.0.1:8000", "HTTP_STRIPE_SIGNATURE": signature,
        "HTTP_ACCEPT": "*/*", "HTTP_ACCEPT_ENCODING": "gzip, deflate", "HTTP_USER_AGENT": "Python/3.11 aiohttp",
        "HTTP_CONNECTION": "close", "wsgi.input": io.BytesIO(body), "wsgi.errors": sys.stderr,
        "wsgi.url_scheme": "http", "wsgi.version": (1, 0), "wsgi.multithread": True, "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }


if __name__ == "__main__":
    sys.exit(main())
