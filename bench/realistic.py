"""The phases against a realistic provider (issue 21): the simulator answers each API call after
150 ± 50 ms and at most 100 requests a second (HTTP 429 beyond), and each figure is judged as a
ratio to what that limit allows, taken in the same run.

- `sweep_real`: the grace sweep (seeded as the `sweep` phase) in `--sweep-workers` processes with
  DUNNING_PROVIDER_IO_THREADS=`--io-threads`; wall time against the rate-limit floor (the provider
  reads it needed ÷ the limit), and its acceptances against a small sequential sweep's.
- `paid_sustained`: invoice.paid deliveries at `--paid-rate` for `--paid-seconds`, open loop, through
  gunicorn and a Celery worker; paid → FULL latency from each delivery's due time.
- `burst_real`: `--real-burst` deliveries at once (32 in flight); the drain rate against the limit.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from bench.common import CHILDREN, SECRET, Ticker, percentile, say
from bench.cpu_accounting import CpuAccount, describe
from bench.figures import (
    ClaimsVerdict,
    ceiling_per_s,
    drain_rate,
    rate_limit_floor,
    ratio_to_floor,
    requests_needed,
)
from bench.services import RedisDb, fresh_db, now, start_celery_processes, start_gunicorn, start_simulator
from bench.sweep import run_sweep, sim_stats

PHASES = ("sweep_real", "paid_sustained", "burst_real")
NEEDS_REDIS = ("paid_sustained", "burst_real")
SWEEP_RATIO_TARGET = 1.15
PAID_P99_TARGET_S = 2.0
DRAIN_TARGET = 0.90
RSS_TARGET_MB = 300


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("realistic provider (phases sweep_real, paid_sustained, burst_real)")
    g.add_argument("--provider-latency-ms", type=float, default=150.0, help="mean latency of each provider call")
    g.add_argument("--provider-latency-spread-ms", type=float, default=50.0, help="its standard deviation")
    g.add_argument("--provider-rate-limit", type=float, default=100.0,
                   help="provider requests a second, reads and writes each, before HTTP 429")
    g.add_argument("--real-sweep-size", type=int, default=None, help="due cycles (default 100000, smoke 30)")
    g.add_argument("--real-reference-size", type=int, default=None,
                   help="cycles of the sequential reference sweep (1 worker, 1 I/O thread; default 50, smoke 5)")
    g.add_argument("--io-threads", type=int, default=16,
                   help="DUNNING_PROVIDER_IO_THREADS for the sweep workers (provider I/O pool inside the job)")
    g.add_argument("--sweep-pacing", type=float, default=None,
                   help="STRIPE_MAX_REQUESTS_PER_SECOND for each sweep worker (default: the rate limit / "
                        "--sweep-workers, as the README says to deploy it; 0: unpaced, the 429 back-off alone)")
    g.add_argument("--paid-rate", type=float, default=None, help="paid deliveries a second (default 50, smoke 10)")
    g.add_argument("--paid-seconds", type=float, default=None, help="seconds of paid deliveries (default 120, smoke 3)")
    g.add_argument("--real-burst", type=int, default=None, help="paid deliveries sent at once (default 1000, smoke 20)")
    g.add_argument("--celery-pool", choices=("prefork", "threads"), default="threads",
                   help="Celery pool of paid_sustained and burst_real")
    g.add_argument("--celery-processes", type=int, default=None,
                   help="Celery worker processes of paid_sustained and burst_real, each with its own pool of "
                        "--celery-concurrency (default: one per CPU; a thread pool runs Python on one core)")


def finish_arguments(a: argparse.Namespace) -> None:
    smoke = a.smoke
    a.real_sweep_size = a.real_sweep_size or (30 if smoke else 100_000)
    a.real_reference_size = a.real_reference_size or (5 if smoke else 50)
    a.paid_rate = a.paid_rate or (10.0 if smoke else 50.0)
    a.paid_seconds = a.paid_seconds or (3.0 if smoke else 120.0)
    a.real_burst = a.real_burst or (20 if smoke else 1000)
    if a.sweep_pacing is None:
        a.sweep_pacing = a.provider_rate_limit / max(1, a.sweep_workers)
    # --celery-concurrency is shared with the restore phase (prefork, 2); a thread pool needs more
    # threads than cores to overlap provider waits.
    a.real_celery_concurrency = a.celery_concurrency or (16 if a.celery_pool == "threads" else 2)
    a.celery_concurrency = a.celery_concurrency or 2
    a.celery_processes = a.celery_processes or os.cpu_count() or 1


def network_flags(a: argparse.Namespace) -> list[str]:
    """bench.simproc's realism flags for this run's provider."""
    return ["--network", "live", "--latency-ms", f"{a.provider_latency_ms:g}",
            "--latency-spread-ms", f"{a.provider_latency_spread_ms:g}", "--rate-limit", f"{a.provider_rate_limit:g}"]


def phases(args: argparse.Namespace, redis: RedisDb | None) -> dict[str, Callable[[], dict[str, Any]]]:
    return {"sweep_real": lambda: phase_sweep_real(args),
            "paid_sustained": lambda: phase_paid_sustained(args, _need(redis)),
            "burst_real": lambda: phase_burst_real(args, _need(redis))}


def _need(redis: RedisDb | None) -> RedisDb:
    if redis is None:
        raise RuntimeError("this phase needs the bench's Redis database")
    return redis


# ---- sweep_real ----------------------------------------------------------------------------------

def _job_receipts() -> dict[str, Any]:
    """The grace sweep's acceptances in the current bench database, aggregated in SQL (100k cycles)."""
    from django.db import connection

    from dunning.models import TransitionReceipt

    table = TransitionReceipt._meta.db_table
    mine = f"FROM {table} WHERE actor = 'job:grace_expiry'"
    with connection.cursor() as cur:
        cur.execute(f"SELECT pattern, count(*) FROM (SELECT cycle_id, string_agg(edge, ',' ORDER BY edge) AS pattern "
                    f"{mine} AND accepted GROUP BY cycle_id) per_cycle GROUP BY pattern")
        patterns = {p: n for p, n in cur.fetchall()}
        cur.execute(f"SELECT count(DISTINCT cycle_id) FROM (SELECT cycle_id, edge {mine} AND accepted "
                    f"GROUP BY cycle_id, edge HAVING count(*) > 1) twice")
        duplicates = cur.fetchone()[0]
        cur.execute(f"SELECT count(*) {mine} AND NOT accepted")
        refused = cur.fetchone()[0]
    return {"patterns": patterns, "duplicates": duplicates, "refused": refused}


def phase_sweep_real(args: argparse.Namespace) -> dict[str, Any]:
    network = network_flags(args)
    size, ref_size = args.real_sweep_size, args.real_reference_size
    say("sweep_real", f"sequential reference: {ref_size} cycles, 1 worker, 1 provider I/O thread")
    reference = run_sweep(ref_size, tag="sweep_real_ref", workers=1, network=network,
                          worker_env={"DUNNING_PROVIDER_IO_THREADS": "1"}, trace_every=1.0)
    ref_receipts = _job_receipts()
    say("sweep_real", f"{size} cycles, {args.sweep_workers} worker(s) x {args.io_threads} provider I/O threads")
    run = run_sweep(size, tag="sweep_real", workers=args.sweep_workers, network=network,
                    worker_env={"DUNNING_PROVIDER_IO_THREADS": str(args.io_threads),
                                "STRIPE_MAX_REQUESTS_PER_SECOND": f"{args.sweep_pacing:g}"},
                    trace_every=1.0 if size <= 20_000 else 5.0)
    receipts = _job_receipts()
    from django.db import connections

    connections.close_all()
    stats = run["sim_stats"]
    needed = requests_needed(stats)
    reads = needed if needed is not None else size  # one fetch per cycle when the counters are missing
    floor = rate_limit_floor(reads, args.provider_rate_limit)
    verdict = ClaimsVerdict(cycles=size, restricted=run["done"], duplicates=receipts["duplicates"],
                            refused=max(receipts["refused"], run.get("refused", 0)), patterns=receipts["patterns"],
                            reference=ref_receipts["patterns"])
    result = {
        "size": size, "workers": args.sweep_workers, "io_threads": args.io_threads, "pacing": args.sweep_pacing,
        "rate_limit": args.provider_rate_limit, "latency_ms": args.provider_latency_ms,
        "latency_spread_ms": args.provider_latency_spread_ms,
        "wall_seconds": run["wall_seconds"], "provider_reads": reads, "floor_seconds": floor,
        "ratio": ratio_to_floor(run["wall_seconds"], floor), "ratio_target": SWEEP_RATIO_TARGET,
        "rate_limited": stats.get("rate_limited_read", 0) + stats.get("rate_limited_write", 0),
        "provider_writes": requests_needed(stats, "write"), "sim_stats": stats,
        "peak_rss_kb": run["peak_rss_kb"], "polled_peak_rss_kb": run["polled_peak_rss_kb"],
        "errors": run.get("errors"), "states_after": run["states_after"], "claims": verdict.as_dict(),
        "trace": run["trace"], "job_start_offset": run["job_start_offset"], "partial": bool(run.get("partial")),
        "cpu": run.get("cpu"),
        "reference": {"size": ref_size, "wall_seconds": reference["wall_seconds"],
                      "per_cycle_ms": reference["per_cycle_ms"], "patterns": ref_receipts["patterns"],
                      "sim_stats": reference["sim_stats"]},
    }
    say("sweep_real", f"{run['done']}/{size} in {run['wall_seconds']:.1f} s; floor {floor:.1f} s "
                      f"({reads} reads / {args.provider_rate_limit:g}/s), ratio {result['ratio'] or 0:.2f}; "
                      f"{result['rate_limited']} answered 429; claims same as sequential: "
                      f"{verdict.same_as_sequential} {verdict.patterns} vs {verdict.reference}")
    return result


# ---- paid_sustained and burst_real -----------------------------------------------------------------

@dataclass
class PaidWorld:
    """gunicorn + a Celery worker + the realistic simulator, over subscriptions in grace whose
    invoices the customer has paid (seeded as the restore phase)."""

    url: str
    api_base: str
    rows: list[dict[str, Any]]
    sub_of: dict[str, int]
    grace_generation: int


@contextmanager
def paid_world(args: argparse.Namespace, redis: RedisDb, n: int, tag: str, warm: int) -> Iterator[PaidWorld]:
    """`warm` more subscriptions are restored first (their deliveries 8 in flight) and not measured: the
    first requests of a fresh gunicorn and Celery worker load code and open connections."""
    from django.db import connections

    from bench.loadgen import burst
    from bench.seed import seed_grace_cycles

    sim, api_base, all_rows = start_simulator(n + warm, paid=True, tag=tag, network=network_flags(args))
    procs = [sim]
    try:
        database = fresh_db(tag)
        seeded = seed_grace_cycles(all_rows, failed_at=now() - timedelta(hours=1), progress=Ticker(tag))
        connections.close_all()
        redis.reset()
        gunicorn, url = start_gunicorn(database, redis.url, api_base=api_base)
        procs.append(gunicorn)
        say(tag, f"{args.celery_processes} celery worker process(es) ({args.celery_pool}, concurrency "
                 f"{args.real_celery_concurrency} each) on {redis.url}")
        procs.extend(start_celery_processes(database, redis.url, api_base, args.real_celery_concurrency,
                                            args.celery_pool, args.celery_processes))
        sub_of = {r["invoice"]: pk for r, pk in zip(all_rows, seeded["subscription_pks"], strict=True)}
        rows, warm_rows = all_rows[:n], all_rows[n:]
        world = PaidWorld(url=url, api_base=api_base, rows=rows, grace_generation=seeded["grace_generation"],
                          sub_of={r["invoice"]: sub_of[r["invoice"]] for r in rows})
        say(tag, f"warm-up: {warm} deliveries, not measured")
        burst(url, [(r["invoice"], r["event"].encode()) for r in warm_rows], SECRET, concurrency=8)
        wait_full(world, [sub_of[r["invoice"]] for r in warm_rows], redis, 120.0, f"{tag} warm-up")
        # Counters and buckets afresh: the seeding's and the warm-up's calls are not the phase's.
        sim_reset(api_base, args)
        yield world
    finally:
        connections.close_all()
        for proc in reversed(procs):
            CHILDREN.stop(proc, timeout=20)


def sim_reset(api_base: str, args: argparse.Namespace) -> None:
    import json
    import urllib.request

    body = json.dumps({"preset": "live", "latency_ms": args.provider_latency_ms,
                       "latency_spread_ms": args.provider_latency_spread_ms,
                       "read_rate": args.provider_rate_limit, "write_rate": args.provider_rate_limit}).encode()
    request = urllib.request.Request(f"{api_base.rstrip('/')}/_sim/realism", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        answer.read()


def wait_full(world: PaidWorld, pks: list[int], redis: RedisDb, timeout: float, tag: str) -> dict[int, float]:
    """subscription pk → epoch of its FULL snapshot, polled until all are restored or `timeout`."""
    from django.db import connections

    from entitlements.models import EntitlementSnapshot
    from entitlements.profiles import FULL

    tick = Ticker(tag)
    began = time.monotonic()
    restored: dict[int, float] = {}
    while time.monotonic() - began < timeout:
        restored = {s: t.timestamp() for s, t in EntitlementSnapshot.objects.filter(
            subscription_id__in=pks, profile=FULL, generation__gt=world.grace_generation).values_list(
            "subscription_id", "issued_at")}
        tick(f"{len(restored)}/{len(pks)} restored to FULL ({redis.queued()} tasks queued)")
        if len(restored) >= len(pks):
            break
        time.sleep(0.5)
    connections.close_all()
    return restored


def _latency_figures(lat: list[float], n: int, restored: int) -> dict[str, Any]:
    complete = restored >= n
    return {"restored": restored, "deliveries": n, "p50_s": percentile(lat, 50), "p90_s": percentile(lat, 90),
            "p99_s": percentile(lat, 99) if complete else None, "max_s": max(lat) if lat else None,
            "latencies_s": [round(v, 4) for v in lat]}


def phase_paid_sustained(args: argparse.Namespace, redis: RedisDb) -> dict[str, Any]:
    from bench.loadgen import open_loop

    n = int(args.paid_rate * args.paid_seconds)
    with paid_world(args, redis, n, "paid_sustained", warm=max(5, int(args.paid_rate))) as world:
        say("paid_sustained", f"{n} invoice.paid deliveries at {args.paid_rate:g}/s for {args.paid_seconds:g} s")
        with CpuAccount() as cpu:
            out = open_loop(world.url, [r["event"].encode() for r in world.rows], args.paid_rate, SECRET,
                            progress=Ticker("paid_sustained"))
            restored = wait_full(world, list(world.sub_of.values()), redis, max(60.0, n * 0.2), "paid_sustained")
        stats = sim_stats(world.api_base)
    due = {world.sub_of[world.rows[i]["invoice"]]: due_at for _, _, _, i, due_at in out["results"]}
    lat = [restored[s] - due[s] for s in due if s in restored]
    reads = requests_needed(stats)
    result = {**_latency_figures(lat, n, len(restored)), "rate": args.paid_rate, "seconds": args.paid_seconds,
              "accepted_200": sum(1 for r in out["results"] if r[2] == 200), "p99_target_s": PAID_P99_TARGET_S,
              "celery_pool": args.celery_pool, "celery_concurrency": args.real_celery_concurrency,
              "celery_processes": args.celery_processes, "rate_limit": args.provider_rate_limit,
              "provider_reads": reads, "sim_stats": stats,
              "reads_per_event": reads / len(restored) if reads is not None and restored else None,
              "rate_limited": stats.get("rate_limited_read", 0) + stats.get("rate_limited_write", 0),
              "cpu": cpu.summary(len(restored), "event")}
    say("paid_sustained", f"{len(restored)}/{n} restored; p50 {result['p50_s']} s, p99 {result['p99_s']} s; "
                          f"{result['rate_limited']} answered 429")
    return result


def phase_burst_real(args: argparse.Namespace, redis: RedisDb) -> dict[str, Any]:
    from bench.loadgen import burst

    n = args.real_burst
    with paid_world(args, redis, n, "burst_real", warm=8 if args.smoke else 32) as world:
        say("burst_real", f"burst of {n} invoice.paid deliveries (32 in flight)")
        with CpuAccount() as cpu:
            sent = burst(world.url, [(r["invoice"], r["event"].encode()) for r in world.rows], SECRET,
                         progress=Ticker("burst_real"))
            restored = wait_full(world, list(world.sub_of.values()), redis, max(120.0, n * 0.5), "burst_real")
        stats = sim_stats(world.api_base)
    first_send = min(at for at, _ in sent.values())
    last_full = max(restored.values()) if restored else first_send
    lat = [restored[world.sub_of[inv]] - at for inv, (at, _) in sent.items() if world.sub_of[inv] in restored]
    reads = requests_needed(stats)
    per_event = reads / len(restored) if reads is not None and restored else None
    rate = drain_rate(len(restored), first_send, last_full)
    result = {**_latency_figures(lat, n, len(restored)), "accepted_200": sum(1 for _, s in sent.values() if s == 200),
              "drain_per_s": rate, "drain_seconds": last_full - first_send, "rate_limit": args.provider_rate_limit,
              "fraction_of_limit": rate / args.provider_rate_limit if rate else None, "target": DRAIN_TARGET,
              "provider_reads": reads, "reads_per_event": per_event,
              "ceiling_per_s": ceiling_per_s(args.provider_rate_limit, per_event), "sim_stats": stats,
              "rate_limited": stats.get("rate_limited_read", 0) + stats.get("rate_limited_write", 0),
              "celery_pool": args.celery_pool, "celery_concurrency": args.real_celery_concurrency,
              "celery_processes": args.celery_processes, "cpu": cpu.summary(len(restored), "event")}
    say("burst_real", f"{len(restored)}/{n} restored in {result['drain_seconds']:.1f} s: {rate or 0:.1f}/s, "
                      f"{result['fraction_of_limit'] or 0:.0%} of the limit; {result['rate_limited']} answered 429")
    return result


# ---- table -------------------------------------------------------------------------------------------

def table_rows(name: str, r: dict[str, Any], row: Callable[[str, str, str, str], None],
               judge: Callable[[Any, bool, bool], str], smoke: bool) -> None:
    rows = {"sweep_real": _rows_sweep, "paid_sustained": _rows_sustained, "burst_real": _rows_burst}
    rows[name](r, row, judge, smoke)
    if r.get("cpu"):
        row("  (info) where the CPU went (bench.cpu_accounting)", describe(r["cpu"]),
            "all cores busy = bound by CPU, not the provider", "info")


def _rows_sweep(r: dict[str, Any], row: Callable, judge: Callable, smoke: bool) -> None:
    limit = f"{r['rate_limit']:g}/s, {r['latency_ms']:g} ± {r['latency_spread_ms']:g} ms"
    ratio = r["ratio"]
    paced = f", paced {r['pacing']:g}/s each" if r.get("pacing") else ""
    row(f"sweep_real {r['size']}, {r['workers']} worker(s) x {r['io_threads']} I/O threads{paced} ({limit})",
        f"{r['wall_seconds']:.1f} s vs floor {r['floor_seconds']:.1f} s ({r['provider_reads']} reads / "
        f"{r['rate_limit']:g}/s) = x{ratio or 0:.2f}; {r['rate_limited']} answered 429",
        f"<= {r['ratio_target']:g} x floor", judge(ratio, ratio is not None and ratio <= r["ratio_target"], smoke))
    c = r["claims"]
    row("sweep_real ordering and claims",
        f"{c['restricted']}/{c['cycles']} RESTRICTED, {c['duplicates']} cycles with an edge accepted twice, "
        f"{c['refused']} refused; accepted per cycle {c['patterns']} (sequential {r['reference']['size']}: "
        f"{c['reference']})", "same as the sequential path", judge(c, c["same_as_sequential"], smoke))
    mb = r["peak_rss_kb"] / 1024
    row("sweep_real worker peak RSS", f"{mb:.0f} MB (VmHWM)", f"< {RSS_TARGET_MB} MB",
        judge(mb, mb < RSS_TARGET_MB, smoke))
    row("  (info) sequential reference, 1 worker x 1 I/O thread",
        f"{r['reference']['per_cycle_ms']:.0f} ms per cycle ({r['reference']['size']} cycles)",
        "what the threads buy", "info")


def _celery(r: dict[str, Any]) -> str:
    """The workers a paid phase ran on; results written before --celery-processes had one."""
    processes = r.get("celery_processes", 1)
    return f"celery {r['celery_pool']} x {r['celery_concurrency']}, {processes} process{'es' if processes > 1 else ''}"


def _rows_sustained(r: dict[str, Any], row: Callable, judge: Callable, smoke: bool) -> None:
    p99 = r["p99_s"]
    row(f"paid->FULL p99, {r['rate']:g}/s for {r['seconds']:g} s ({_celery(r)})",
        (f"{p99:.2f} s" if p99 is not None else "incomplete") + f" (p50 {r['p50_s'] or 0:.2f} s, "
        f"{r['restored']}/{r['deliveries']} restored, {r['deliveries'] - r['accepted_200']} deliveries not answered "
        f"200 (client timeout 30 s, or an error), {r['rate_limited']} answered 429)",
        f"p99 < {r['p99_target_s']:g} s", judge(p99, p99 is not None and p99 < r["p99_target_s"], smoke))
    if r.get("reads_per_event") is not None:
        row("  (info) provider reads per paid event (sustained)", f"{r['reads_per_event']:.2f}",
            f"{r['rate']:g}/s x reads <= {r['rate_limit']:g}/s", "info")


def _rows_burst(r: dict[str, Any], row: Callable, judge: Callable, smoke: bool) -> None:
    frac = r["fraction_of_limit"]
    per = r.get("reads_per_event")
    row(f"burst_real {r['deliveries']} drain rate ({_celery(r)})",
        f"{r['drain_per_s'] or 0:.1f}/s = {frac or 0:.0%} of the {r['rate_limit']:g}/s limit "
        f"({r['restored']}/{r['deliveries']} restored in {r['drain_seconds']:.1f} s, {r['rate_limited']} answered 429, "
        f"{r['deliveries'] - r['accepted_200']} not answered 200)",
        f">= {r['target']:.0%} of the limit", judge(frac, frac is not None and frac >= r["target"], smoke))
    row("  (info) physical ceiling = limit / provider reads per event",
        f"{r['ceiling_per_s']:.0f}/s ({per:.2f} reads per event)" if per else f"{r['ceiling_per_s']:.0f}/s",
        "one GET per event: the limit itself", "info")
