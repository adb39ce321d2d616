"""The bench runner: `python -m bench [--smoke] [options]`. See bench/README.md."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench import agentpay_bench, agentpay_chain_bench
from bench.common import (
    ACCOUNT,
    CHILDREN,
    DB_PREFIX,
    HARD_DECLINE,
    PG_HOST,
    PG_PORT,
    PG_USER,
    PYTHON,
    ROOT,
    SECRET,
    VENV_BIN,
    SpeedProbe,
    Ticker,
    child_env,
    db_create,
    db_created,
    db_drop,
    db_url,
    elapsed,
    free_port,
    peak_rss_kb,
    percentile,
    say,
    use_db,
    wait_port,
)

TEMPLATE = f"{DB_PREFIX}_template"
OUT_DIR = ROOT / "var" / "bench"
LOG_DIR = OUT_DIR / "logs"


# ---- sizes ---------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description="Throughput, latency and scale bench.")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, < 60 s, targets not judged (CI)")
    p.add_argument("--only", default="accept,webhook,restore,sweep,agentpay,agentpay_chain",
                   help="comma-separated phases to run (accept, webhook, restore, sweep, agentpay, agentpay_chain)")
    p.add_argument("--accept-seconds", type=float, default=None, help="per client count (default 10, smoke 2)")
    p.add_argument("--pgbench-scale", type=int, default=None, help="pgbench -i -s (default 10, smoke 1)")
    p.add_argument("--rate", type=float, default=200.0, help="offered webhook rate, deliveries/s")
    p.add_argument("--webhook-seconds", type=float, default=None, help="measured seconds (default 15, smoke 1)")
    p.add_argument("--burst", type=int, default=None, help="invoice.paid burst size (default 1000, smoke 20)")
    p.add_argument("--celery-concurrency", type=int, default=2)
    p.add_argument("--sweep-sizes", default=None, help="two sizes, small,large (default 10000,100000; smoke 20,60)")
    p.add_argument("--profile-size", type=int, default=None,
                   help="cycles in the separate pyinstrument-profiled sweep (default 1000, smoke 20; 0 = none)")
    p.add_argument("--sweep-workers", type=int, default=2,
                   help="grace_expiry job runs at once on the same due rows (the job's claims share them out)")
    p.add_argument("--sweep-budget", type=float, default=0.0,
                   help="minutes the large sweep may run; past it the run is stopped and reported as PARTIAL "
                        "(per-cycle cost on the large table, extrapolated wall time; not judged). 0 = no limit")
    p.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/11"),
                   help="a Redis database the bench may own and flush (must be empty or the bench's)")
    p.add_argument("--keep-dbs", action="store_true", help="leave the bench_dunning_* databases behind")
    p.add_argument("--out", default=str(OUT_DIR / "results.json"))
    agentpay_bench.add_arguments(p)
    agentpay_chain_bench.add_arguments(p)
    a = p.parse_args(argv)
    smoke = a.smoke
    agentpay_bench.finish_arguments(a)
    agentpay_chain_bench.finish_arguments(a)
    a.accept_seconds = a.accept_seconds or (2.0 if smoke else 10.0)
    a.pgbench_scale = a.pgbench_scale or (1 if smoke else 10)
    a.webhook_seconds = a.webhook_seconds or (1.0 if smoke else 15.0)
    a.burst = a.burst or (20 if smoke else 1000)
    sizes = a.sweep_sizes or ("20,60" if smoke else "10000,100000")
    a.sweep_sizes = [int(s) for s in sizes.split(",")]
    if len(a.sweep_sizes) != 2 or a.sweep_sizes[0] >= a.sweep_sizes[1]:
        p.error("--sweep-sizes takes two increasing sizes, e.g. 10000,100000")
    a.profile_size = a.profile_size if a.profile_size is not None else (20 if smoke else 1000)
    a.phases = [x.strip() for x in a.only.split(",") if x.strip()]
    return a


# ---- setup -----------------------------------------------------------------------------------------

def setup_template() -> None:
    say("setup", f"creating {TEMPLATE} (migrate + shipped policies)")
    db_create(TEMPLATE)
    started = time.monotonic()
    subprocess.run([PYTHON, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, check=True,
                   env=child_env(DATABASE_URL=db_url(TEMPLATE)))
    use_db(TEMPLATE)
    from bench.seed import publish_shipped_policies

    publish_shipped_policies()
    use_db(TEMPLATE)
    from django.db import connections

    connections.close_all()
    say("setup", f"template ready in {time.monotonic() - started:.1f} s")


def fresh_db(phase: str) -> str:
    from django.db import connections

    connections.close_all()
    name = f"{DB_PREFIX}_{phase}"
    db_create(name, template=TEMPLATE)
    use_db(name)
    return name


def fake_rows(n: int, tag: str) -> list[dict[str, Any]]:
    return [{"customer": f"cus_{tag}{i}", "subscription": f"sub_{tag}{i}", "invoice": f"in_{tag}{i}",
             "amount": 2000, "currency": "usd", "attempt_count": 1, "payment_ref": f"pi_{tag}{i}",
             "decline_code": HARD_DECLINE} for i in range(n)]


def now():  # noqa: ANN201
    from dunning.clock import trusted_now

    return trusted_now()


def start_simulator(count: int, *, paid: bool, tag: str) -> tuple[subprocess.Popen, str, list[dict[str, Any]]]:
    out = OUT_DIR / f"sim_{tag}.json"
    argv = [PYTHON, "-m", "bench.simproc", "--count", str(count), "--out", str(out)] + (["--paid"] if paid else [])
    proc = CHILDREN.start("simulator", argv, env=child_env(), stdout=subprocess.PIPE)
    tick = Ticker("simulator")
    started = time.monotonic()
    say("simulator", f"seeding {count} {'paid ' if paid else ''}invoices in a simulator subprocess")
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line.startswith("READY "):
        raise RuntimeError(f"simulator did not start: {line!r} (exit {proc.poll()})")
    base = line.split()[1]
    data = json.loads(out.read_text())
    tick(f"{count} invoices at {base} (seed {data['seed_seconds']} s, pay {data['paid_seconds']} s, "
         f"total {time.monotonic() - started:.1f} s)", force=True)
    return proc, base, data["rows"]


def start_gunicorn(database: str, redis_url: str, *, api_base: str = "", per_request_connections: bool = False
                   ) -> tuple[subprocess.Popen, str]:
    """gunicorn on the product's settings; ``per_request_connections`` sets DB_CONN_MAX_AGE=0
    (a new PostgreSQL connection per request) for the informational comparison."""
    port = free_port()
    env = child_env(DATABASE_URL=db_url(database), REDIS_URL=redis_url, ALLOWED_HOSTS="127.0.0.1,localhost",
                    **({"STRIPE_API_BASE": api_base} if api_base else {}),
                    **({"DB_CONN_MAX_AGE": "0"} if per_request_connections else {}))
    argv = [str(VENV_BIN / "gunicorn"), "config.wsgi:application", "--workers", "2", "--worker-class", "sync",
            "--bind", f"127.0.0.1:{port}", "--log-level", "warning", "--graceful-timeout", "5"]
    proc = CHILDREN.start("gunicorn", argv, env=env, log=LOG_DIR / "gunicorn.log")
    wait_port(port, 30, proc)
    return proc, f"http://127.0.0.1:{port}/webhooks/stripe/"


def start_celery(database: str, redis_url: str, api_base: str, concurrency: int) -> subprocess.Popen:
    log = LOG_DIR / "celery.log"
    log.write_text("")
    env = child_env(DATABASE_URL=db_url(database), REDIS_URL=redis_url, STRIPE_API_BASE=api_base)
    pool = os.environ.get("BENCH_CELERY_POOL", "prefork")  # threads: the paid path's recommended pool
    argv = [str(VENV_BIN / "celery"), "-A", "config", "worker", "-P", pool, "-c", str(concurrency),
            "-l", "INFO", "--without-gossip", "--without-mingle", "--without-heartbeat",
            "-n", f"bench{os.getpid()}@%h"]
    proc = CHILDREN.start("celery", argv, env=env, log=log)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"celery worker exited ({proc.returncode}); see {log}")
        if " ready." in log.read_text(errors="replace"):
            return proc
        time.sleep(0.2)
    raise RuntimeError(f"celery worker not ready after 60 s; see {log}")


class RedisDb:
    """The Redis database the bench owns: refused if it holds someone else's keys."""

    MARK = "bench:dunning:owner"

    def __init__(self, url: str) -> None:
        import redis

        self.url = url
        self.r = redis.Redis.from_url(url)
        size = self.r.dbsize()
        owner = self.r.get(self.MARK)
        if size and (owner or b"").decode() != DB_PREFIX:
            raise SystemExit(f"{url} holds {size} keys that are not this bench's ({DB_PREFIX}); "
                             "pass --redis-url with a free db")
        self.r.set(self.MARK, DB_PREFIX)

    def reset(self) -> None:
        self.r.flushdb()
        self.r.set(self.MARK, DB_PREFIX)

    def queued(self) -> int:
        return int(self.r.llen("celery"))

    def release(self) -> None:
        self.r.flushdb()


# ---- phase 1: acceptance vs pgbench --------------------------------------------------------------

def pgbench(args: argparse.Namespace, clients: int) -> float:
    base = ["-h", PG_HOST, "-p", str(PG_PORT), "-U", PG_USER]
    out = subprocess.run(["pgbench", *base, "-c", str(clients), "-j", str(clients), "-T",
                          str(int(max(1, args.accept_seconds))), f"{DB_PREFIX}_pgbench"],
                         capture_output=True, text=True, check=True)
    match = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out.stdout)
    if not match:
        raise RuntimeError(f"pgbench printed no tps: {out.stdout}\n{out.stderr}")
    return float(match.group(1))


def phase_accept(args: argparse.Namespace) -> dict[str, Any]:
    from bench import accept_worker
    from bench.seed import seed_grace_cycles

    say("acceptance", f"pgbench -i -s {args.pgbench_scale} on {DB_PREFIX}_pgbench")
    db_create(f"{DB_PREFIX}_pgbench")
    subprocess.run(["pgbench", "-h", PG_HOST, "-p", str(PG_PORT), "-U", PG_USER, "-i", "-q", "-s",
                    str(args.pgbench_scale), f"{DB_PREFIX}_pgbench"], check=True, capture_output=True)
    database = fresh_db("accept")
    per_worker = 20
    seeded = seed_grace_cycles(fake_rows(2 * per_worker, "acc"), failed_at=now() - timedelta(hours=1))
    from django.db import connections

    connections.close_all()
    pks = seeded["cycle_pks"]
    ctx = multiprocessing.get_context("spawn")
    rows = []

    def workers(clients: int, seconds: float, profile: str = "") -> list[dict[str, Any]]:
        ready, results, start = ctx.Queue(), ctx.Queue(), ctx.Event()
        procs = [ctx.Process(target=accept_worker.run,
                             args=(db_url(database), pks[w * per_worker:(w + 1) * per_worker], ready, start,
                                   seconds, results, profile), daemon=True) for w in range(clients)]
        for proc in procs:
            proc.start()
        try:
            for _ in procs:
                ready.get(timeout=120)
            start.set()
            outs = [results.get(timeout=seconds + 120) for _ in procs]
        finally:
            for proc in procs:
                proc.join(10)
                if proc.is_alive():
                    proc.kill()
        errors = [o["error"] for o in outs if "error" in o]
        if errors:
            raise RuntimeError(errors[0])
        return outs

    for clients in (1, 2):
        tps_pg = pgbench(args, clients)
        say("acceptance", f"pgbench tpcb-like -c {clients}: {tps_pg:.0f} tps")
        say("acceptance", f"{clients} worker(s) running record_evidence for {args.accept_seconds:.0f} s")
        outs = workers(clients, args.accept_seconds)
        accepted = sum(o["accepted"] for o in outs)
        tps_app = sum(o["accepted"] / o["seconds"] for o in outs)
        ratio = tps_app / tps_pg if tps_pg else 0.0
        say("acceptance", f"{clients} worker(s): {tps_app:.0f} accepted/s ({accepted} accepted, "
                          f"{sum(o['refused'] for o in outs)} refused); {ratio:.0%} of pgbench")
        rows.append({"clients": clients, "accepted_per_s": tps_app, "accepted": accepted,
                     "refused": sum(o["refused"] for o in outs), "pgbench_tps": tps_pg, "ratio": ratio,
                     "seconds": args.accept_seconds, "queries_per_acceptance": outs[0]["queries_per_acceptance"]})
    profile = OUT_DIR / "accept_profile.txt"
    say("acceptance", f"profiling one worker for {min(args.accept_seconds, 3):.0f} s with pyinstrument -> {profile}")
    workers(1, min(args.accept_seconds, 3.0), str(profile))
    return {"edge": "record_evidence (full §6 transaction, no FSM move)", "cycles_per_worker": per_worker,
            "pgbench_scale": args.pgbench_scale, "runs": rows, "profile": str(profile)}


# ---- phase 2: webhook ingest -----------------------------------------------------------------------

def webhook_run(args: argparse.Namespace, redis: RedisDb, database: str, *, per_request: bool) -> dict[str, Any]:
    from bench.loadgen import open_loop, synthetic_event
    from dunning.models import ProviderEvent

    label = "webhook+conn-per-request" if per_request else "webhook"
    redis.reset()
    proc, url = start_gunicorn(database, redis.url, per_request_connections=per_request)
    tag = f"{int(time.time() * 1000)}"
    warm = [synthetic_event(f"evt_warm{tag}_{i}", f"in_w{i}", ACCOUNT) for i in range(int(args.rate))]
    n = int(args.rate * args.webhook_seconds)
    bodies = [synthetic_event(f"evt_bench{tag}_{i}", f"in_b{i}", ACCOUNT) for i in range(n)]
    say(label, f"gunicorn (2 sync workers{', DB_CONN_MAX_AGE=0' if per_request else ''}) at {url}; "
               f"warm-up 1 s at {args.rate:.0f}/s")
    try:
        open_loop(url, warm, args.rate, SECRET)
        say(label, f"measuring {n} signed deliveries at {args.rate:.0f}/s ({args.webhook_seconds:.0f} s)")
        out = open_loop(url, bodies, args.rate, SECRET, progress=Ticker(label))
    finally:
        CHILDREN.stop(proc)
    res = out["results"]
    ok = [r for r in res if r[2] == 200]
    from_due = [r[0] * 1000 for r in res]
    from_send = [r[1] * 1000 for r in res]
    stored = ProviderEvent.objects.filter(event_id__startswith=f"evt_bench{tag}_").count()
    queued = redis.queued()
    redis.reset()
    result = {
        "connection_per_request": per_request, "offered_rate": args.rate, "deliveries": n, "ok_200": len(ok),
        "errors": n - len(ok), "achieved_per_s": len(ok) / out["wall"] if out["wall"] else 0.0,
        "p50_ms": percentile(from_due, 50), "p99_ms": percentile(from_due, 99), "max_ms": max(from_due),
        "p50_ms_from_send": percentile(from_send, 50), "p99_ms_from_send": percentile(from_send, 99),
        "events_stored": stored, "tasks_on_broker": queued, "latencies_ms": [round(v, 3) for v in from_due],
    }
    say(label, f"p50 {result['p50_ms']:.1f} ms, p99 {result['p99_ms']:.1f} ms, {result['achieved_per_s']:.0f}/s, "
               f"{result['errors']} errors; {stored} events stored, {queued} tasks on the broker")
    return result


def phase_webhook(args: argparse.Namespace, redis: RedisDb) -> dict[str, Any]:
    database = fresh_db("webhook")
    result = webhook_run(args, redis, database, per_request=False)
    result["variant_connection_per_request"] = webhook_run(args, redis, database, per_request=True)
    result["profile"] = profile_webhook(args, redis, database)
    from django.db import connections

    connections.close_all()
    return result


def profile_webhook(args: argparse.Namespace, redis: RedisDb, database: str) -> dict[str, Any]:
    """What one delivery costs a gunicorn worker, without HTTP, load generator or queueing:
    deliveries back to back through the Django stack in one process under pyinstrument."""
    path = OUT_DIR / "webhook_profile.txt"
    count = 30 if args.smoke else 500
    say("webhook", f"profiling {count} deliveries through the Django stack in one process -> {path}")
    redis.reset()
    env = child_env(DATABASE_URL=db_url(database), REDIS_URL=redis.url, ALLOWED_HOSTS="127.0.0.1,localhost")
    out = subprocess.run([PYTHON, "-m", "bench.webhook_profile", "--count", str(count), "--profile", str(path)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), "")
    if not line:
        raise RuntimeError(f"bench.webhook_profile gave no result (exit {out.returncode}): {out.stderr[-2000:]}")
    result = json.loads(line[7:]) | {"file": str(path)}
    say("webhook", f"{count} deliveries in one process: {result['ms_per_delivery']:.1f} ms each")
    return result


# ---- phase 3: paid -> restored ---------------------------------------------------------------------

def phase_restore(args: argparse.Namespace, redis: RedisDb) -> dict[str, Any]:
    from django.db.models import Count

    from bench.loadgen import burst
    from bench.seed import seed_grace_cycles

    n = args.burst
    held = max(10, n // 10)  # processed afterwards in one process under pyinstrument
    sim, api_base, all_rows = start_simulator(n + held, paid=True, tag="restore")
    rows, held_rows = all_rows[:n], all_rows[n:]
    database = fresh_db("restore")
    seeded = seed_grace_cycles(all_rows, failed_at=now() - timedelta(hours=1), progress=Ticker("restore"))
    seeded["subscription_pks"] = seeded["subscription_pks"][:n]
    from django.db import connections

    connections.close_all()
    redis.reset()
    gunicorn, url = start_gunicorn(database, redis.url, api_base=api_base)
    say("restore", f"starting celery worker ({os.environ.get('BENCH_CELERY_POOL', 'prefork')}, concurrency "
                   f"{args.celery_concurrency}) on {redis.url}")
    worker = start_celery(database, redis.url, api_base, args.celery_concurrency)
    sub_of = {r["invoice"]: pk for r, pk in zip(rows, seeded["subscription_pks"], strict=True)}
    items = [(r["invoice"], r["event"].encode()) for r in rows]
    say("restore", f"burst of {n} invoice.paid deliveries for subscriptions in grace")
    began = time.time()
    sent = burst(url, items, SECRET, progress=Ticker("restore"))
    sent_done = time.time()
    say("restore", f"burst sent in {sent_done - began:.2f} s; waiting for FULL snapshots")
    from entitlements.models import EntitlementSnapshot
    from entitlements.profiles import FULL

    pks = list(sub_of.values())
    timeout = max(60.0, n * 0.3)
    tick = Ticker("restore")
    restored: dict[int, float] = {}
    while time.time() - began < timeout:
        restored = {s: t.timestamp() for s, t in EntitlementSnapshot.objects.filter(
            subscription_id__in=pks, profile=FULL, generation__gt=seeded["grace_generation"]).values_list(
            "subscription_id", "issued_at")}
        tick(f"{len(restored)}/{n} restored to FULL ({redis.queued()} tasks queued)")
        if len(restored) >= n:
            break
        time.sleep(0.5)
    connections.close_all()
    CHILDREN.stop(worker, timeout=20)
    from dunning.models import ProviderEvent

    outcomes = dict(ProviderEvent.objects.order_by().values_list("outcome").annotate(n=Count("pk")))
    connections.close_all()
    profile = profile_event_processing(url, api_base, database, held_rows)
    CHILDREN.stop(gunicorn)
    CHILDREN.stop(sim)
    lat = [restored[sub_of[inv]] - at for inv, (at, _) in sent.items() if sub_of[inv] in restored]
    last = max(restored.values()) if restored else began
    result = {
        "deliveries": n, "accepted_200": sum(1 for _, s in sent.values() if s == 200), "restored": len(restored),
        "burst_send_seconds": sent_done - began, "drain_seconds": last - began,
        "throughput_per_s": len(restored) / (last - began) if restored and last > began else 0.0,
        "p50_s": percentile(lat, 50), "p90_s": percentile(lat, 90), "p99_s": percentile(lat, 99),
        "max_s": max(lat) if lat else None, "min_s": min(lat) if lat else None,
        "celery_concurrency": args.celery_concurrency, "event_outcomes": outcomes, "profile": profile,
        "latencies_s": [round(v, 4) for v in lat],
    }
    if len(restored) < n:
        result["p99_s"] = None  # incomplete: not every subscription was restored before the timeout
    say("restore", f"{len(restored)}/{n} restored; p50 {result['p50_s']} s, p99 {result['p99_s']} s, "
                   f"{result['throughput_per_s']:.1f} restorations/s")
    return result


def profile_event_processing(url: str, api_base: str, database: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The held-out deliveries go through gunicorn with no Celery worker running; one process
    then does their Celery work back to back under pyinstrument (var/bench/restore_profile.txt)."""
    from bench.loadgen import burst

    path = OUT_DIR / "restore_profile.txt"
    burst(url, [(r["invoice"], r["event"].encode()) for r in rows], SECRET)
    say("restore", f"profiling the processing of {len(rows)} more invoice.paid events in one process -> {path}")
    env = child_env(DATABASE_URL=db_url(database), STRIPE_API_BASE=api_base)
    out = subprocess.run([PYTHON, "-m", "bench.event_worker", "--profile", str(path)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), "")
    if not line:
        raise RuntimeError(f"bench.event_worker gave no result (exit {out.returncode}): {out.stderr[-2000:]}")
    result = json.loads(line[7:])
    result["file"] = str(path)
    result["ms_per_event"] = 1000 * result["wall_seconds"] / max(result["events"], 1)
    say("restore", f"{result['events']} events in {result['wall_seconds']:.1f} s in one process "
                   f"({result['ms_per_event']:.0f} ms each); outcomes {result['outcomes']}")
    return result


# ---- phase 4+5: grace sweep, plans, memory, profile ------------------------------------------------

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
            elif text.startswith("PROGRESS "):
                self.progress = text[9:]
        return self.proc.poll() is None or bool(chunk)


def _restricted_count() -> int:
    from dunning.models import DunningCycle
    from dunning.states import CycleState

    return DunningCycle.objects.filter(state=CycleState.RESTRICTED).count()


def run_sweep(size: int, *, tag: str, profile: str = "", budget_seconds: float = 0.0, workers: int = 1
              ) -> dict[str, Any]:
    """Seed `size` due cycles and run the grace_expiry job over them in `workers` concurrent
    processes (the job's claims let them share the due rows: a row another worker holds is skipped)."""
    from django.db.models import Count

    from bench.seed import seed_grace_cycles

    sim, api_base, rows = start_simulator(size, paid=False, tag=tag)
    database = fresh_db(tag)
    began = time.monotonic()
    seed_grace_cycles(rows, failed_at=now() - timedelta(days=10), progress=Ticker(tag, 5))
    del rows
    say(tag, f"seeded {size} due cycles in {time.monotonic() - began:.1f} s")
    plans = explain_due_queries(now())
    from django.db import connections

    env = child_env(DATABASE_URL=db_url(database), STRIPE_API_BASE=api_base, STRIPE_TIMEOUT_SECONDS="30")
    argv = [PYTHON, "-m", "bench.sweep_worker"] + (["--profile", profile] if profile else [])
    started = time.monotonic()
    procs = [SweepWorker(argv, env) for _ in range(workers)]
    say(tag, f"grace_expiry over {size} due cycles in {workers} worker subprocess(es) "
             f"(pids {', '.join(str(w.proc.pid) for w in procs)})" + (" under pyinstrument" if profile else ""))
    tick = Ticker(tag, 5)
    stopped_at_budget = False
    trace: list[tuple[float, int, int]] = [(0.0, 0, 0)]  # (seconds, cycles restricted, peak RSS MB so far)
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
        if elapsed - last_count >= 5:
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
                  **{k: sum(r[k] for r in results) for k in ("examined", "changed", "refused", "errors")},
                  "workers_detail": results}
    result.update({"size": size, "workers": workers, "process_wall_seconds": wall_outside, "polled_peak_rss_kb": peak,
                   "states_after": states, "explain": plans, "done": done,
                   "per_cycle_ms": 1000 * result["wall_seconds"] / max(done, 1),
                   "trace": [*trace, (round(wall_outside, 2), done, peak // 1024)],
                   "all_restricted": done == size})
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
        prof = run_sweep(args.profile_size, tag="sweep_profile", profile=str(path))
        profile = {"size": args.profile_size, "file": str(path), "wall_seconds": prof["wall_seconds"]}
    big = runs[str(large)]
    wall_large = big["extrapolated_wall_seconds"] if big.get("partial") else big["wall_seconds"]
    ratio = wall_large / runs[str(small)]["wall_seconds"] if wall_large else None
    return {"sizes": [small, large], "workers": args.sweep_workers, "runs": runs, "ratio": ratio,
            "ratio_target": 1.1 * large / small,
            "partial": bool(big.get("partial")),
            "per_cycle_ratio": big["per_cycle_ms"] / runs[str(small)]["per_cycle_ms"], "profile": profile}


# ---- report ----------------------------------------------------------------------------------------

def judge(value: float | None, ok: bool, smoke: bool) -> str:
    if value is None:
        return "FAIL" if not smoke else "n/a"
    if smoke:
        return "n/a (smoke)"
    return "PASS" if ok else "FAIL"


def plan_summary(plans: dict[str, str]) -> tuple[str, int]:
    """Each plan's scan nodes ("first_page: Index Scan using ...") and the rows all of them removed by filter."""
    scans = []
    for name, plan in plans.items():
        nodes = re.findall(r"((?:Parallel )?(?:Seq|Index|Index Only|Bitmap Heap|Bitmap Index) Scan(?: using \S+)?)",
                           plan)
        scans.append(f"{name}: {', '.join(dict.fromkeys(nodes)) or 'no scan node'}")
    removed = sum(int(n) for plan in plans.values() for n in re.findall(r"Rows Removed by Filter: (\d+)", plan))
    return "; ".join(scans), removed


def table(results: dict[str, Any], smoke: bool) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []

    def row(name: str, value: str, target: str, verdict: str) -> None:
        out.append({"figure": name, "value": value, "target": target, "verdict": verdict})

    acc = results.get("accept")
    if acc:
        for r in acc["runs"]:
            row(f"acceptance c={r['clients']}", f"{r['accepted_per_s']:.0f}/s vs pgbench {r['pgbench_tps']:.0f} tps "
                f"= {r['ratio']:.0%}", ">= 25% of pgbench", judge(r["ratio"], r["ratio"] >= 0.25, smoke))
    wh = results.get("webhook")
    if wh:
        row(f"webhook p99 @ {wh['offered_rate']:.0f}/s", f"{wh['p99_ms']:.1f} ms (p50 {wh['p50_ms']:.1f} ms, "
            f"{wh['achieved_per_s']:.0f}/s, {wh['errors']} err)", "p99 < 20 ms, 0 errors",
            judge(wh["p99_ms"], wh["p99_ms"] < 20 and wh["errors"] == 0, smoke))
        if wh.get("profile"):
            ms = wh["profile"]["ms_per_delivery"]
            row("  (info) one delivery's service time", f"{ms:.1f} ms in one process, no HTTP (2 workers at "
                f"{wh['offered_rate']:.0f}/s are then {wh['offered_rate'] * ms / 2000:.0%} busy before HTTP)",
                "p99 < 20 ms needs headroom", "info")
        v = wh["variant_connection_per_request"]
        row("  (info) same, DB_CONN_MAX_AGE=0", f"{v['p99_ms']:.1f} ms (p50 {v['p50_ms']:.1f} ms, "
            f"{v['achieved_per_s']:.0f}/s, {v['errors']} err)", "what persistence buys", "info")
    rs = results.get("restore")
    if rs:
        p99 = rs["p99_s"]
        row(f"paid->FULL p99 (burst {rs['deliveries']})",
            f"{p99:.2f} s (p50 {rs['p50_s']:.2f} s, {rs['restored']}/{rs['deliveries']} restored, "
            f"{rs['throughput_per_s']:.1f}/s)" if p99 is not None else
            f"incomplete: {rs['restored']}/{rs['deliveries']} restored", "p99 < 1 s",
            judge(p99, p99 is not None and p99 < 1.0, smoke))
        if rs["throughput_per_s"]:
            # Whatever the order of work, the 99th-percentile restoration comes after 99 % of the
            # burst was processed, and its delivery was sent at the latest when the burst was.
            floor = max(0.0, 0.99 * rs["deliveries"] / rs["throughput_per_s"] - rs["burst_send_seconds"])
            per_event_ms = 1000 * rs["celery_concurrency"] / rs["throughput_per_s"]
            row("  (info) p99 floor = 0.99 x burst / rate - send time",
                f"{floor:.2f} s at {rs['throughput_per_s']:.1f} "
                f"restorations/s ({per_event_ms:.0f} ms per event per worker; profiled alone: "
                f"{rs['profile']['ms_per_event']:.0f} ms)",
                "seed's release gate: 60 s", "info")
    sw = results.get("sweep")
    if sw:
        small, large = sw["sizes"]
        rs_, rl = sw["runs"][str(small)], sw["runs"][str(large)]
        scans, removed = plan_summary(rl["explain"])
        row(f"EXPLAIN due-row pages ({large} rows)", f"{scans}; {removed} rows removed by filter",
            "index scans", judge(scans, "Seq Scan" not in scans and "Index" in scans, smoke))
        if sw.get("partial"):
            row(f"sweep {small} / {large}, {sw.get('workers', 1)} worker(s) (PARTIAL)",
                f"{rs_['wall_seconds']:.1f} s / {rl['done']} of {large} in {rl['wall_seconds']:.0f} s; "
                f"{rs_['per_cycle_ms']:.1f} vs {rl['per_cycle_ms']:.1f} ms/cycle (x{sw['per_cycle_ratio']:.2f}); "
                f"extrapolated ratio {sw['ratio']:.2f}" if sw["ratio"] else "no cycle finished",
                f"ratio <= {sw['ratio_target']:.1f}", "not judged (partial)")
            mb = rl["peak_rss_kb"] / 1024
            row(f"sweep worker peak RSS (first {rl['done']} of {large})", f"{mb:.0f} MB", "< 300 MB",
                "not judged (partial)")
        else:
            row(f"sweep {small} / {large}, {sw.get('workers', 1)} worker(s)",
                f"{rs_['wall_seconds']:.1f} s / {rl['wall_seconds']:.1f} s "
                f"(ratio {sw['ratio']:.2f})", f"ratio <= {sw['ratio_target']:.1f}",
                judge(sw["ratio"], sw["ratio"] <= sw["ratio_target"] and rs_["all_restricted"]
                      and rl["all_restricted"], smoke))
            mb = rl["peak_rss_kb"] / 1024
            row(f"sweep worker peak RSS ({large})", f"{mb:.0f} MB", "< 300 MB", judge(mb, mb < 300, smoke))
    if results.get("agentpay"):
        agentpay_bench.table_rows(results["agentpay"], row, judge, smoke)
    if results.get("agentpay_chain"):
        agentpay_chain_bench.table_rows(results["agentpay_chain"], row, judge, smoke)
    speeds = [f"{name} {min(r['machine_loop_s']):.2f}-{max(r['machine_loop_s']):.2f}"
              for name in ("accept", "webhook", "restore", "sweep", "agentpay", "agentpay_chain")
              if (r := results.get(name)) and r.get("machine_loop_s")]
    if speeds:
        row("  (info) machine: 10^7-loop seconds per phase", "; ".join(speeds), "same machine, same speed", "info")
    return out


def print_table(rows: list[dict[str, str]]) -> None:
    widths = {k: max(len(k), *(len(r[k]) for r in rows)) for k in ("figure", "value", "target", "verdict")}
    line = "  ".join(k.upper().ljust(widths[k]) for k in widths)
    print("\n" + line + "\n" + "-" * len(line))
    for r in rows:
        print("  ".join(r[k].ljust(widths[k]) for k in widths))


def plot(results: dict[str, Any], path: Path) -> str:
    """The picture is a convenience: a plotting failure must not fail a finished run."""
    from bench.plots import draw

    try:
        drawn = draw(results, path)
    except Exception as exc:  # noqa: BLE001
        return f"not drawn: {exc!r}"
    return str(drawn) if drawn else "not drawn (matplotlib missing, or no phase ran)"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = "python -m bench " + " ".join(argv if argv is not None else sys.argv[1:])
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    os.environ["DATABASE_URL"] = db_url(TEMPLATE)
    os.environ.pop("REDIS_URL", None)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    results: dict[str, Any] = {"command": command, "smoke": args.smoke, "started_at": time.strftime("%FT%T%z"),
                               "cpus": os.cpu_count(), "loadavg_start": os.getloadavg()}
    redis = None
    code = 0
    probe = SpeedProbe(every=30.0 if args.smoke else 120.0).start()
    try:
        db_create(TEMPLATE)  # so django.setup() has a database to point at
        import django

        django.setup()
        setup_template()
        if "webhook" in args.phases or "restore" in args.phases:
            redis = RedisDb(args.redis_url)
        phases = {"accept": lambda: phase_accept(args), "webhook": lambda: phase_webhook(args, redis),
                  "restore": lambda: phase_restore(args, redis), "sweep": lambda: phase_sweep(args),
                  "agentpay": lambda: agentpay_bench.phase(args, fresh_db, LOG_DIR, OUT_DIR),
                  "agentpay_chain": lambda: agentpay_chain_bench.phase(args, fresh_db, LOG_DIR, OUT_DIR)}
        for name, phase in phases.items():
            if name in args.phases:
                began = elapsed()
                results[name] = phase()
                probe.sample()  # at least one reading per phase, however short
                results[name]["machine_loop_s"] = probe.between(began, elapsed())
    except KeyboardInterrupt:
        say("bench", "interrupted; stopping children")
        code = 130
    except Exception as exc:
        say("bench", f"failed: {exc!r}")
        results["error"] = repr(exc)
        code = 1
        import traceback

        traceback.print_exc()
    finally:
        CHILDREN.stop_all()
        if redis is not None:
            redis.release()
        from django.db import connections

        connections.close_all()
        if not args.keep_dbs:
            for name in db_created():
                db_drop(name)
    results["loadavg_end"] = os.getloadavg()
    results["speed_probe"] = probe.stop()
    results["table"] = table(results, args.smoke)
    Path(args.out).write_text(json.dumps(results, indent=2, default=str))
    sweep = results.get("sweep")
    if sweep:
        small, large = sweep["sizes"]
        print(f"\nEXPLAIN of the due-row queries ({large} rows; {EXPLAIN_NOTE}):")
        for name, plan in sweep["runs"][str(large)]["explain"].items():
            print(f"--- {name}\n{plan}")
        if sweep.get("profile"):
            print(f"\npyinstrument profile of a {sweep['profile']['size']}-cycle sweep: {sweep['profile']['file']}")
    if results["table"]:
        print_table(results["table"])
    print(f"\nresults: {args.out}\nplot: {plot(results, Path(args.out).with_suffix('.png'))}\ncommand: {command}")
    if args.smoke and code == 0:
        print("smoke: every phase ran end to end (targets not judged at smoke sizes)")
    return code
