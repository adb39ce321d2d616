"""``python -m bench.webhook_profile --count N --profile FILE``: N signed ``invoice.paid``
deliveries timed, then N more under pyinstrument, through the whole Django stack (middleware,
view, intake, Celery hand-off to Redis) in this one process, back to back: the work a gunicorn
worker does per delivery in the webhook phase, without the HTTP server, the load generator or
queueing. DATABASE_URL, REDIS_URL and the webhook secret come from the environment.

Prints one ``RESULT <json>`` line: deliveries, wall seconds (untimed by the profiler), ms each.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.webhook_profile")
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--profile", required=True)
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.test import Client
    from pyinstrument import Profiler

    from bench.common import ACCOUNT, SECRET
    from bench.loadgen import sign, synthetic_event

    client = Client(HTTP_HOST="127.0.0.1")
    tag = f"{int(time.time() * 1000)}"

    def deliver(i: int) -> None:
        body = synthetic_event(f"evt_prof{tag}_{i}", f"in_prof{i}", ACCOUNT)
        response = client.post("/webhooks/stripe/", data=body, content_type="application/json",
                                HTTP_STRIPE_SIGNATURE=sign(body, SECRET))
        if response.status_code != 200:
            raise SystemExit(f"delivery {i} answered {response.status_code}: {response.content[:300]!r}")

    for i in range(20):  # warm: connections, caches, the broker's channel
        deliver(-1 - i)
    began = time.perf_counter()
    for i in range(args.count):  # timed without the profiler, which slows what it samples
        deliver(i)
    wall = time.perf_counter() - began
    profiler = Profiler(interval=0.0005)
    profiler.start()
    for i in range(args.count, 2 * args.count):
        deliver(i)
    profiler.stop()
    with open(args.profile, "w") as fh:
        fh.write(profiler.output_text(unicode=False, color=False))
    print("RESULT " + json.dumps({"deliveries": args.count, "wall_seconds": wall,
                                  "ms_per_delivery": 1000 * wall / args.count}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
