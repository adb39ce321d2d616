"""``python -m bench.event_worker --profile FILE``: process every PENDING provider event in this
process, one after another, under pyinstrument — the work a Celery worker does per
`invoice.paid` in the restore phase (fresh fetch from the simulator, evidence, acceptance,
FULL snapshot), without the broker. DATABASE_URL and STRIPE_API_BASE come from the environment.

Prints one ``RESULT <json>`` line: events processed, wall seconds, outcomes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.event_worker")
    parser.add_argument("--profile", required=True)
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from pyinstrument import Profiler

    from dunning.evidence.processing import event_process
    from dunning.models import ProviderEvent
    from dunning.models.evidence import EventOutcome

    pending = list(ProviderEvent.objects.filter(outcome=EventOutcome.PENDING).order_by("pk")
                   .values_list("pk", flat=True))
    outcomes: Counter[str] = Counter()
    profiler = Profiler(interval=0.001)
    profiler.start()
    began = time.perf_counter()
    for pk in pending:
        outcomes[event_process(event_pk=pk)] += 1
    wall = time.perf_counter() - began
    profiler.stop()
    with open(args.profile, "w") as fh:
        fh.write(profiler.output_text(unicode=False, color=False))
    print("RESULT " + json.dumps({"events": len(pending), "wall_seconds": wall, "outcomes": outcomes}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
