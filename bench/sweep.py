"""The grace sweep: seed due cycles, run `job_run("grace_expiry")` in worker subprocesses, watch
their progress and memory; the `sweep` phase (two sizes, EXPLAIN, profile). `bench.realistic`
runs the same sweep against the simulator's realistic network."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from bench.common import CHILDREN, PYTHON, Ticker, child_env, db_url, peak_rss_kb, say
from bench.cpu_accounting import CpuAccount
from bench.services import OUT_DIR, fresh_db, now, start_simulator


def sim_stats(api_base: str) -> dict[str, Any]:
    """The simulator's network counters (GET /_sim/realism): requests seen, how many answered 429."""
    try:
        with urllib.request.urlopen(f"{api_base.rstrip('/')}/_sim/realism", timeout=10) as answer:
            return json.loads(answer.read())
    except OSError as exc:
        return {"error": repr(exc)}


EXPLAIN_NOTE = ("dunning.jobs.framework.due_page(DunningCycle.objects.filter(state=GRACE_ACTIVE, "
                "grace_expires_at__lte=now), 'grace_expires_at'): the first page and a keyset page from the middle")


def explain_due_queries(run_now) -> dict[str, str]:  # noqa: ANN001
    """The plans of the sweep's own page query: the first page, and a keyset page from the middle
    of the due rows (where a predicate the index cannot use would show as rows removed by filter)."""
    from django.db import connection

    from dunning.jobs.framework import due_page
    from dunning.models import DunningCycle
    from dunning.states import CycleState

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE dunning_dunningcycle")
    due = DunningCycle.objects.filter(state=CycleState.GRACE_ACTIVE, grace_expires_at__lte=run_now)
    ordered = due.order_by("grace_expires_at", "pk").values_list("grace_expires_at", "pk")
    middle = ordered[due.count() // 2] if due.exists() else (run_now, 0)
    plans = {}
    for name, page in (("first_page", due_page(due, "grace_expires_at")),
                       ("keyset_page_mid", due_page(due, "grace_expires_at", tuple(middle)))):
        plans[name] = str(page.query) + "\n" + page.explain(analyze=True, buffers=True)
    return plans


class SweepWorker:
    """One `python -m bench.sweep_worker` subprocess and what it has said so far."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = CHILDREN.start("sweep", argv, env=env, stdout=subprocess.PIPE)
        assert self.proc.stdout is not None
        os.set_blocking(self.proc.stdout.fileno(), False)
        self.buffer = b""
        self.result: dict[str, Any] = {}
        self.peak_kb = 0
        self.progress = ""
        self.job_started_epoch: float | None = None

    def poll(self) -> bool:
        """Read what the worker printed; True while it runs or has output left."""
        self.peak_kb = max(self.peak_kb, peak_rss_kb(self.proc.pid))
        assert self.proc.stdout is not None
        chunk = self.proc.stdout.read() or b""
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            text = line.decode(errors="replace")
            if text.startswith("RESULT "):
                self.result = json.loads(text[7:])
            elif text.startswith("STARTED "):
                self.job_started_epoch = float(text[8:])
            elif text.startswith("PROGRESS "):
                self.progress = text[9:]
        return self.proc.poll() is None or bool(chunk)


def _restricted_count() -> int:
    from dunning.models import DunningCycle
    from dunning.states import CycleState

    return DunningCycle.objects.filter(state=CycleState.RESTRICTED).count()


def run_sweep(size: int, *, tag: str, profile: str = "", budget_seconds: float = 0.0, workers: int = 1,
              network: Sequence[str] = (), worker_env: dict[str, str] | None = None, trace_every: float = 5.0,
              measure: bool = False) -> dict[str, Any]:
    """Seed `size` due cycles and run the grace_expiry job over them in `workers` concurrent
    processes (the job's claims let them share the due rows: a row another worker holds is skipped).

    `measure`: one worker on one thread counting statements and CPU per cycle (bench.sweep_worker --measure).
    `network`: the simulator's realism flags; `worker_env`: more environment for the workers (e.g.
    DUNNING_PROVIDER_IO_THREADS); `trace_every`: seconds between progress samples. The result
    carries the simulator's own counters (`sim_stats`: requests seen, 429s answered)."""
    from django.db.models import Count

    from bench.seed import seed_grace_cycles

    sim, api_base, rows = start_simulator(size, paid=False, tag=tag, network=network)
    database = fresh_db(tag)
    began = time.monotonic()
    seed_grace_cycles(rows, failed_at=now() - timedelta(days=10), progress=Ticker(tag, 5))
    del rows
    say(tag, f"seeded {size} due cycles in {time.monotonic() - began:.1f} s")
    plans = explain_due_queries(now())
    from django.db import connections

    env = child_env(DATABASE_URL=db_url(database), STRIPE_API_BASE=api_base, STRIPE_TIMEOUT_SECONDS="30",
                    **(worker_env or {}))
    argv = ([PYTHON, "-m", "bench.sweep_worker"] + (["--profile", profile] if profile else [])
            + (["--measure"] if measure else []))
    started, started_epoch = time.monotonic(), time.time()
    procs = [SweepWorker(argv, env) for _ in range(workers)]
    say(tag, f"grace_expiry over {size} due cycles in {workers} worker subprocess(es) "
             f"(pids {', '.join(str(w.proc.pid) for w in procs)})" + (" under pyinstrument" if profile else ""))
    tick = Ticker(tag, 5)
    stopped_at_budget = False
    trace: list[tuple[float, int, int]] = [(0.0, 0, 0)]  # (seconds, cycles restricted, peak RSS MB so far)
    with CpuAccount() as cpu:
        last_count = 0.0
        while True:
            running = [w.poll() for w in procs]
            peak = max(w.peak_kb for w in procs)
            elapsed = time.monotonic() - started
            if budget_seconds and elapsed > budget_seconds and any(running):
                say(tag, f"budget of {budget_seconds / 60:.0f} min reached; stopping the worker(s) (PARTIAL run)")
                for w in procs:
                    CHILDREN.stop(w.proc)  # a killed acceptance rolls back whole; finished cycles stay RESTRICTED
                stopped_at_budget = True
                break
            if elapsed - last_count >= trace_every:
                last_count = elapsed
                done_so_far = _restricted_count()
                trace.append((round(elapsed, 2), done_so_far, peak // 1024))
                tick(f"{done_so_far}/{size} restricted ({elapsed:.0f} s, peak RSS {peak // 1024} MB); "
                     + " | ".join(w.progress for w in procs if w.progress))
            if not any(running):
                break
            time.sleep(0.25)
    wall_outside = time.monotonic() - started
    for w in procs:
        CHILDREN.stop(w.proc)
    stats = sim_stats(api_base)
    CHILDREN.stop(sim)
    missing = [w.proc.pid for w in procs if not w.result]
    if missing and not stopped_at_budget:
        raise RuntimeError(f"sweep worker(s) {missing} exited without a result")
    from dunning.models import DunningCycle
    from dunning.states import CycleState

    states = dict(DunningCycle.objects.values_list("state").annotate(n=Count("pk")))
    connections.close_all()
    done = states.get(CycleState.RESTRICTED, 0)
    peak = max(w.peak_kb for w in procs)
    if stopped_at_budget:
        # The workers' own counters died with them: time and memory are the parent's observations.
        result = {"partial": True, "wall_seconds": wall_outside, "status": "STOPPED_AT_BUDGET",
                  "peak_rss_kb": peak, "done": done,
                  "extrapolated_wall_seconds": wall_outside * size / done if done else None}
    else:
        results = [w.result for w in procs]
        result = {"wall_seconds": max(r["wall_seconds"] for r in results),
                  "status": "/".join(sorted({r["status"] for r in results})),
                  "peak_rss_kb": max(r["peak_rss_kb"] for r in results),
                  "cpu": cpu.summary(done, "cycle"),
                  **{k: sum(r[k] for r in results) for k in ("examined", "changed", "refused", "errors")},
                  "workers_detail": results}
    result.update({"size": size, "workers": workers, "process_wall_seconds": wall_outside, "polled_peak_rss_kb": peak,
                   "states_after": states, "explain": plans, "done": done,
                   "per_cycle_ms": 1000 * result["wall_seconds"] / max(done, 1),
                   "trace": [*trace, (round(wall_outside, 2), done, peak // 1024)],
                   "all_restricted": done == size, "sim_stats": stats,
                   # seconds from the workers' start (the trace's clock) to the first job's start (setup done)
                   "job_start_offset": min((w.job_started_epoch - started_epoch for w in procs
                                            if w.job_started_epoch is not None), default=0.0)})
    say(tag, f"{done}/{size} cycles restricted: {result['wall_seconds']:.1f} s ({result['per_cycle_ms']:.1f} "
             f"ms/cycle), peak RSS {result['peak_rss_kb'] / 1024:.0f} MB, states {states}, job {result['status']}")
    return result


def phase_sweep(args: argparse.Namespace) -> dict[str, Any]:
    small, large = args.sweep_sizes
    runs = {str(small): run_sweep(small, tag="sweep_small", workers=args.sweep_workers)}
    estimate = runs[str(small)]["per_cycle_ms"] * large / 1000
    say("sweep", f"at {runs[str(small)]['per_cycle_ms']:.1f} ms/cycle the {large}-cycle sweep should take "
                 f"about {estimate / 60:.0f} min (plus seeding)")
    runs[str(large)] = run_sweep(large, tag="sweep_large", budget_seconds=60 * args.sweep_budget,
                                 workers=args.sweep_workers)
    profile = None
    if args.profile_size:
        path = OUT_DIR / "sweep_profile.txt"
        # One thread: pyinstrument samples the calling thread only, which with the provider-I/O
        # threads would show nothing but claims and waiting.
        prof = run_sweep(args.profile_size, tag="sweep_profile", profile=str(path),
                         worker_env={"DUNNING_PROVIDER_IO_THREADS": "1"})
        profile = {"size": args.profile_size, "file": str(path), "wall_seconds": prof["wall_seconds"]}
        measured = run_sweep(args.profile_size, tag="sweep_measure", measure=True)["workers_detail"][0]["measure"]
        profile["measure"] = {k: v for k, v in measured.items() if k != "sample"}
        say("sweep_measure", f"per cycle, one thread: {measured['statements_per_cycle']:.1f} statements "
                             f"{measured['by_kind_per_cycle']}, job CPU {measured['job_cpu_ms_per_cycle']:.1f} ms, "
                             f"PostgreSQL backend CPU {measured['db_cpu_ms_per_cycle']:.1f} ms")
    big = runs[str(large)]
    wall_large = big["extrapolated_wall_seconds"] if big.get("partial") else big["wall_seconds"]
    ratio = wall_large / runs[str(small)]["wall_seconds"] if wall_large else None
    return {"sizes": [small, large], "workers": args.sweep_workers, "runs": runs, "ratio": ratio,
            "ratio_target": 1.1 * large / small,
            "partial": bool(big.get("partial")),
            "per_cycle_ratio": big["per_cycle_ms"] / runs[str(small)]["per_cycle_ms"], "profile": profile}

