"""``python -m bench.sweep_worker [--profile FILE]``: one run of the `grace_expiry` job in this
process, against DATABASE_URL and STRIPE_API_BASE from the environment.

Prints ``STARTED <epoch>`` when the job begins, ``PROGRESS <text>`` lines while it runs and one
``RESULT <json>`` line at the end:
wall time of the job, the JobRun counters and this process's peak RSS (VmHWM).
With --profile the run is sampled by pyinstrument and the text report is written to FILE.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time


def _vm_hwm_kb() -> int:
    """This process's peak resident set (VmHWM), which starts afresh at exec."""
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sweep_worker")
    parser.add_argument("--profile", default="")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from dunning.jobs.framework import job_run

    rss_before = _vm_hwm_kb()
    profiler = None
    if args.profile:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.002)
        profiler.start()
    print(f"STARTED {time.time()}", flush=True)  # the job's own start, after django.setup(): the trace's origin
    began = time.perf_counter()
    record = job_run("grace_expiry", progress=lambda text: print(f"PROGRESS {text}", flush=True))
    wall = time.perf_counter() - began
    if profiler is not None:
        profiler.stop()
        with open(args.profile, "w") as fh:
            fh.write(profiler.output_text(unicode=False, color=False, show_all=False))
    result = {
        "wall_seconds": wall, "status": record.status, "examined": record.examined, "changed": record.changed,
        "refused": record.refused, "errors": record.errors,
        "peak_rss_kb": _vm_hwm_kb(), "rss_after_setup_kb": rss_before,
        # Linux keeps ru_maxrss across fork + exec: it starts at the bench parent's own peak
        # (which seeded the rows in memory), so it is kept for the record, not reported.
        "ru_maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "detail": record.detail[:2000],
    }
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
