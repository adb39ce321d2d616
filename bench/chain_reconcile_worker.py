"""``python -m bench.chain_reconcile_worker --timeout S``: the reconcile job of the on-chain rail
(`agentpay_onchain_reconcile`, agentpay/chain/reconcile.py) run again and again, as beat would,
until no on-chain settlement is submitted, pending or unknown (or `--timeout` seconds passed).

A process of its own, so the job's threads do not share a GIL with the bench's JSON-RPC proxy.
Prints one ``PROGRESS <json>`` line per run (the settlement states after it) and ``RESULT <json>``.
DATABASE_URL from the environment.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

LIVE = ("submitted", "pending", "unknown")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chain_reconcile_worker")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--pause", type=float, default=0.1, help="seconds between two runs")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    import logging

    logging.disable(logging.INFO)
    from django.db.models import Count

    from agentpay.jobs import agentpay_job_run
    from agentpay.models import Settlement

    def states() -> dict[str, int]:
        return dict(Settlement.objects.filter(intent__rail="onchain").order_by().values_list("state")
                    .annotate(n=Count("pk")))

    began = time.perf_counter()
    runs, errors, notes = 0, 0, []
    now = states()
    while True:
        run = agentpay_job_run("agentpay_onchain_reconcile")
        runs += 1
        errors += run.errors
        notes.extend(run.notes[:5])
        now = states()
        took = time.perf_counter() - began
        live = sum(now.get(s, 0) for s in LIVE)
        print("PROGRESS " + json.dumps({"seconds": round(took, 3), "run": runs, "examined": run.examined,
                                        "changed": run.changed, "errors": run.errors, "states": now, "live": live}),
              flush=True)
        if not live or took > args.timeout:
            break
        time.sleep(args.pause)
    print("RESULT " + json.dumps({"seconds": time.perf_counter() - began, "runs": runs, "errors": errors,
                                  "states": now, "notes": notes[:20],
                                  "timed_out": sum(now.get(s, 0) for s in LIVE) > 0}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
