"""``python -m bench.sweep_worker [--profile FILE]``: one run of the `grace_expiry` job in this
process, against DATABASE_URL and STRIPE_API_BASE from the environment.

Prints ``STARTED <epoch>`` when the job begins, ``PROGRESS <text>`` lines while it runs and one
``RESULT <json>`` line at the end:
wall time of the job, the JobRun counters and this process's peak RSS (VmHWM).
With --profile the run is sampled by pyinstrument and the text report is written to FILE.
With --measure the job runs on one thread (DUNNING_PROVIDER_IO_THREADS=1) and the result gains
what one cycle costs in process: the statements it sends (by kind), this process's CPU and the
CPU of its PostgreSQL backend (read from /proc: the bench runs the database on this machine).
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


def _backend_cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


class _Measure:
    """Statements (an execute wrapper on the job's one connection), this process's CPU and its
    PostgreSQL backend's CPU over the run.

    Not CaptureQueriesContext: it forces Django's debug cursor, which records every statement's
    executed text; under server-side binding that text is rebuilt by mogrifying the statement
    with its parameters on a client-side cursor, a cost the job never pays in production (~0.3 ms
    a statement here), so it would bias the job CPU against server-side binding."""

    def __enter__(self) -> _Measure:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            self.backend = cursor.fetchone()[0]
        self.statements: list[str] = []
        self.wrapper = connection.execute_wrapper(self._record)
        self.wrapper.__enter__()
        self.cpu, self.db_cpu = time.process_time(), _backend_cpu_seconds(self.backend)
        return self

    def _record(self, execute, sql, params, many, context):  # noqa: ANN001, ANN202 - Django's wrapper protocol
        self.statements.append(sql)
        return execute(sql, params, many, context)

    def __exit__(self, *exc: object) -> None:
        self.cpu, self.db_cpu = time.process_time() - self.cpu, _backend_cpu_seconds(self.backend) - self.db_cpu
        self.wrapper.__exit__(*exc)

    def result(self, cycles: int) -> dict:
        kinds: dict[str, int] = {}
        for statement in self.statements:
            sql = statement.lstrip()
            kind = sql.split(None, 1)[0].upper() if sql else "?"
            if kind == "WITH":  # a data-modifying CTE statement: named by what it writes
                kind = "WITH(" + "+".join(sorted({w for w in ("INSERT", "UPDATE") if w in sql.upper()})) + ")"
            kinds[kind] = kinds.get(kind, 0) + 1
        n = max(cycles, 1)
        return {"measure": {
            "cycles": cycles, "statements": len(self.statements),
            "statements_per_cycle": len(self.statements) / n,
            "by_kind_per_cycle": {k: round(v / n, 2) for k, v in sorted(kinds.items())},
            "job_cpu_ms_per_cycle": 1000 * self.cpu / n, "db_cpu_ms_per_cycle": 1000 * self.db_cpu / n,
            "sample": [q[:300] for q in self.statements[:80]],
        }}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sweep_worker")
    parser.add_argument("--profile", default="")
    parser.add_argument("--measure", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    if args.measure:
        os.environ["DUNNING_PROVIDER_IO_THREADS"] = "1"  # every statement on this thread's connection
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
    measure = _Measure() if args.measure else None
    began = time.perf_counter()
    if measure is not None:
        with measure:
            record = job_run("grace_expiry", progress=lambda text: print(f"PROGRESS {text}", flush=True))
    else:
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
        **(measure.result(record.examined) if measure is not None else {}),
    }
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
