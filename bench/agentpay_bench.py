"""The `agentpay` phase of the bench (issue 17 item 8). See bench/README.md.

(a) Hold + capture throughput: N spawned workers (`bench.agentpay_worker`) run paid calls through
    the real services for a fixed time, on one hot wallet and on 1,000 wallets, each beside
    `pgbench -b tpcb-like` with the same client count on its own database. Target: ≥ 25 %.
(b) The gateway's added p99: an open-loop client (bench.rawhttp) offers calls at a fixed rate (200/s)
    to the upstream directly, then through the gateway (gunicorn, 2 sync workers) to the same
    upstream on loopback; latency from each request's due time. Target: added p99 < 10 ms.
Both with a pyinstrument profile of what bounds them (`var/bench/agentpay_*_profile.txt`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import re
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench import rawhttp
from bench.common import (
    CHILDREN,
    DB_PREFIX,
    PG_HOST,
    PG_PORT,
    PG_USER,
    PYTHON,
    Ticker,
    child_env,
    db_create,
    db_url,
    free_port,
    gunicorn_argv,
    percentile,
    say,
    wait_port,
    without_collector_pauses,
    write_back_dirty_pages,
)
from bench.cpu_accounting import CpuAccount, describe

PHASE = "agentpay"
FLOAT = 10**12  # minor units in every bench wallet: never the limit


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--agentpay-seconds", type=float, default=None, help="per throughput run (default 10, smoke 2)")
    p.add_argument("--agentpay-clients", default="1,2", help="worker processes = pgbench clients, e.g. 1,2")
    p.add_argument("--agentpay-wallets", type=int, default=None, help="the spread case (default 1000, smoke 20)")
    p.add_argument("--agentpay-gateway-seconds", type=float, default=None, help="measured (default 15, smoke 1)")


def finish_arguments(a: argparse.Namespace) -> None:
    a.agentpay_seconds = a.agentpay_seconds or (2.0 if a.smoke else 10.0)
    a.agentpay_wallets = a.agentpay_wallets or (20 if a.smoke else 1000)
    a.agentpay_gateway_seconds = a.agentpay_gateway_seconds or (1.0 if a.smoke else 15.0)
    a.agentpay_client_counts = [int(c) for c in a.agentpay_clients.split(",") if c.strip()]


# ---- seeding --------------------------------------------------------------------------------------

def seed(wallets: int, upstream: str) -> dict[str, Any]:
    """`wallets` tenants with a funded wallet (tenant_create, then a posted credit), an API key for
    the gateway's tenant, and one priced route (1 minor unit a call) to `upstream`."""
    from django.db import transaction

    from agentpay.api.auth import tenant_api_key_create
    from agentpay.bridge import trusted_now
    from agentpay.models import AccountKind, PricedRoute, Tenant
    from agentpay.services.ledger import ledger_credit_wallet
    from agentpay.services.tenants import tenant_create

    started = time.monotonic()
    tick = Ticker(PHASE)
    tenants = []
    for n in range(wallets + 1):
        tenant = tenant_create(name=f"bench tenant {n}")
        with transaction.atomic(durable=True):
            ledger_credit_wallet(tenant=tenant, currency="usd", amount=FLOAT, source=AccountKind.STAFF_CREDIT,
                                 actor="bench", now=trusted_now(), reason="bench float")
        tenants.append(tenant.pk)
        tick(f"seeded {n + 1}/{wallets + 1} funded wallets")
    route = PricedRoute.objects.create(
        slug="bench", name="bench", upstream_base_url=upstream, upstream_path="/call", method="POST", price_minor=1,
        currency="usd", rails_allowed=["wallet"], connect_timeout_seconds=2.0, read_timeout_seconds=5.0,
        status_query_url=f"{upstream}/status")
    raw_key = tenant_api_key_create(tenant=Tenant.objects.get(pk=tenants[-1]), label="bench")[1]
    say(PHASE, f"{wallets + 1} funded wallets and a route in {time.monotonic() - started:.1f} s")
    return {"hot": tenants[:1], "spread": tenants[:wallets], "gateway": tenants[-1], "route": route.pk,
            "api_key": raw_key}


# ---- (a) throughput --------------------------------------------------------------------------------

def _pgbench_init(name: str, scale: int) -> None:
    db_create(name)
    subprocess.run(["pgbench", "-h", PG_HOST, "-p", str(PG_PORT), "-U", PG_USER, "-i", "-q", "-s", str(scale), name],
                   check=True, capture_output=True)


def _pgbench(name: str, clients: int, seconds: float) -> float:
    out = subprocess.run(["pgbench", "-h", PG_HOST, "-p", str(PG_PORT), "-U", PG_USER, "-b", "tpcb-like",
                          "-c", str(clients), "-j", str(clients), "-T", str(int(max(1, seconds))), name],
                         capture_output=True, text=True, check=True)
    match = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out.stdout)
    if not match:
        raise RuntimeError(f"pgbench printed no tps: {out.stdout}\n{out.stderr}")
    return float(match.group(1))


def _workers(database: str, tenants: list[int], route: int, clients: int, seconds: float,
             profile: str = "") -> list[dict[str, Any]]:
    from bench import agentpay_worker

    ctx = multiprocessing.get_context("spawn")
    ready, results, start = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=agentpay_worker.run, args=(db_url(database), tenants, route, ready, start, seconds,
                                                           results, profile), daemon=True) for _ in range(clients)]
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


def throughput(args: argparse.Namespace, database: str, seeded: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    pg = f"{DB_PREFIX}_agentpay_pgbench"
    say(PHASE, f"pgbench -i -s {args.pgbench_scale} on {pg}")
    _pgbench_init(pg, args.pgbench_scale)
    from django.db import connections

    connections.close_all()
    rows = []
    for wallets, tenants in (("1 hot wallet", seeded["hot"]), (f"{len(seeded['spread'])} wallets",
                                                                seeded["spread"])):
        for clients in args.agentpay_client_counts:
            tps_pg = _pgbench(pg, clients, args.agentpay_seconds)
            say(PHASE, f"pgbench tpcb-like -c {clients}: {tps_pg:.0f} tps")
            outs = _workers(database, tenants, seeded["route"], clients, args.agentpay_seconds)
            calls = sum(o["completed"] / o["seconds"] for o in outs)
            ratio = calls / tps_pg if tps_pg else 0.0
            say(PHASE, f"{wallets}, {clients} worker(s): {calls:.0f} hold+capture/s "
                       f"({sum(o['completed'] for o in outs)} paid calls, {sum(o['failed'] for o in outs)} not "
                       f"completed); {ratio:.0%} of pgbench")
            rows.append({"wallets": wallets, "clients": clients, "calls_per_s": calls, "pgbench_tps": tps_pg,
                         "ratio": ratio, "completed": sum(o["completed"] for o in outs),
                         "failed": sum(o["failed"] for o in outs), "seconds": args.agentpay_seconds})
    profile = out_dir / "agentpay_hold_capture_profile.txt"
    say(PHASE, f"profiling one worker (1,000 wallets) for {min(args.agentpay_seconds, 3):.0f} s -> {profile}")
    _workers(database, seeded["spread"], seeded["route"], 1, min(args.agentpay_seconds, 3.0), str(profile))
    return {"runs": rows, "profile": str(profile), "pgbench_scale": args.pgbench_scale,
            "unit": "one paid call = intent_open taking payload_verified+hold_acquired+dispatch, then one "
                    "acceptance (upstream_2xx+capture+settlement_confirmed); upstream answered in process"}


# ---- (b) gateway added latency ------------------------------------------------------------------------

def open_loop(url: str, n: int, rate: float, headers: Any, progress: Any = None) -> dict[str, Any]:
    """POST n JSON bodies at a fixed offered rate; request i is due at start + i/rate whatever
    happened to the others; (latency from due, from send, status) per request. Each request is
    built before the window and sent on its own connection by `bench.rawhttp` (about 0.7 ms of
    the bench's CPU a request, where aiohttp's client took 1.1: the cores the server under test shares)."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    raws = [rawhttp.request_bytes("POST", host, port, parts.path, headers(i), json.dumps({"q": i}).encode())
            for i in range(n)]

    async def go() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        results: list[tuple[float, float, int]] = []
        start = loop.time() + 0.2

        async def one(i: int) -> None:
            due = start + i / rate
            await asyncio.sleep(max(0.0, due - loop.time()))
            sent = loop.time()
            try:
                status = (await asyncio.wait_for(rawhttp.send(host, port, raws[i]), 30))[0]
            except Exception:  # noqa: BLE001 - a failed request is counted, not raised
                status = 0
            done = loop.time()
            results.append((done - due, done - sent, status))
            if progress and len(results) % max(1, int(rate)) == 0:
                progress(f"{len(results)}/{n} answered")

        started_unix = time.time() + (start - loop.time())  # to match the window with other logs
        await asyncio.gather(*(one(i) for i in range(n)))
        return {"results": results, "wall": loop.time() - start, "started_unix": started_unix}

    with without_collector_pauses():
        return asyncio.run(go())


def summary(label: str, out: dict[str, Any], n: int, *, phase: str = PHASE, ok_status: int = 200) -> dict[str, Any]:
    """An open-loop run's figures: answers with `ok_status` are served, anything else an error."""
    res = out["results"]
    ok = [r for r in res if r[2] == ok_status]
    due = [r[0] * 1000 for r in res]
    sent = [r[1] * 1000 for r in res]
    s = {"requests": n, f"ok_{ok_status}": len(ok), "errors": n - len(ok), "achieved_per_s": len(ok) / out["wall"],
         "p50_ms": percentile(due, 50), "p99_ms": percentile(due, 99), "max_ms": max(due),
         "p50_ms_from_send": percentile(sent, 50), "p99_ms_from_send": percentile(sent, 99),
         "latencies_ms": [round(v, 3) for v in due], "window_started_unix": out.get("started_unix")}
    say(phase, f"{label}: p50 {s['p50_ms']:.1f} ms, p99 {s['p99_ms']:.1f} ms, {s['achieved_per_s']:.0f}/s, "
               f"{s['errors']} errors")
    return s


def measured_open_loop(label: str, url: str, n: int, rate: float, headers: Any, *, phase: str = PHASE,
                       ok_status: int = 200, unit: str = "call") -> dict[str, Any]:
    """The timed window: `open_loop`'s summary, with where the machine's CPU went meanwhile. The setup's
    dirty pages are written back first (`write_back_dirty_pages`)."""
    written_back = write_back_dirty_pages(phase)
    with CpuAccount() as cpu:
        out = open_loop(url, n, rate, headers, Ticker(phase))
    result = summary(label, out, n, phase=phase, ok_status=ok_status)
    result["cpu"] = cpu.summary(n, unit)
    result["written_back_before"] = written_back
    say(phase, f"{label}: {describe(result['cpu'])}")
    return result


def gateway_workers() -> int:
    """The gateway's gunicorn processes: BENCH_GATEWAY_WORKERS, 2 unless set."""
    return max(1, int(os.environ.get("BENCH_GATEWAY_WORKERS", "2")))


def start_gateway(database: str, log: Path, name: str = "gunicorn-agentpay") -> tuple[subprocess.Popen, int,
                                                                                       dict[str, str]]:
    """gunicorn serving the gateway on a free port: (process, port, its env). `gateway_workers()` sync
    workers (2 unless BENCH_GATEWAY_WORKERS says), or with BENCH_GATEWAY_THREADS=N > 1 gthread workers
    x N threads (tried at 4 on 2026-12-04: one short run better, the full phase worse,
    bench/last_run/README.md)."""
    port = free_port()
    env = child_env(DATABASE_URL=db_url(database), ALLOWED_HOSTS="127.0.0.1,localhost")
    threads = int(os.environ.get("BENCH_GATEWAY_THREADS", "1"))
    proc = CHILDREN.start(name, gunicorn_argv(port, gateway_workers(), threads), env=env, log=log)
    wait_port(port, 30, proc)
    return proc, port, env


def profile_calls(env: dict[str, str], api_key: str, profile: Path, *, route: str = "bench", status: int = 200,
                  count: int = 200) -> dict[str, Any]:
    """One gateway call's service time and queries in one process (`bench.agentpay_profile`)."""
    out = subprocess.run([PYTHON, "-m", "bench.agentpay_profile", "--count", str(count), "--profile", str(profile),
                          "--api-key", api_key, "--route", route, "--status", str(status)],
                         env=env, capture_output=True, text=True)
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), "")
    if not line:
        raise RuntimeError(f"bench.agentpay_profile gave no result (exit {out.returncode}): "
                           f"{(out.stdout + out.stderr)[-2000:]}")
    return {**json.loads(line[len("RESULT "):]), "file": str(profile)}


def gateway(args: argparse.Namespace, database: str, seeded: dict[str, Any], upstream: str, log_dir: Path,
            out_dir: Path) -> dict[str, Any]:
    proc, port, env = start_gateway(database, log_dir / "gunicorn-agentpay.log")
    rate, n = args.rate, int(args.rate * args.agentpay_gateway_seconds)
    tag = uuid.uuid4().hex[:8]
    auth = {"Authorization": f"Bearer {seeded['api_key']}", "Content-Type": "application/json"}
    direct_url, gateway_url = f"{upstream}/call", f"http://127.0.0.1:{port}/agentpay/v1/routes/bench/run"
    result: dict[str, Any] = {"offered_rate": rate, "seconds": args.agentpay_gateway_seconds,
                              "gunicorn_workers": gateway_workers()}
    try:
        for label, url in (("direct", direct_url), ("gateway", gateway_url)):
            def headers(i: int, label: str = label) -> dict[str, str]:
                return {**auth, "Idempotency-Key": f"{tag}-{label}-{i}"}

            say(PHASE, f"{label}: warm-up 1 s at {rate:.0f}/s, then {n} calls at {rate:.0f}/s -> {url}")
            open_loop(url, int(rate), rate, lambda i, h=headers: h(-1 - i))
            result[label] = measured_open_loop(label, url, n, rate, headers)
    finally:
        CHILDREN.stop(proc)
    result["added_p99_ms"] = result["gateway"]["p99_ms"] - result["direct"]["p99_ms"]
    result["added_p50_ms"] = result["gateway"]["p50_ms"] - result["direct"]["p50_ms"]
    profile = out_dir / "agentpay_gateway_profile.txt"
    result["profile"] = profile_calls(env, seeded["api_key"], profile)
    say(PHASE, f"one gateway call in one process (no HTTP server, no queueing): "
               f"{result['profile']['ms_per_call']:.1f} ms, {result['profile']['queries_per_call']} queries; "
               f"profile {profile}")
    return result


# ---- the phase --------------------------------------------------------------------------------------

def phase(args: argparse.Namespace, fresh_db: Any, log_dir: Path, out_dir: Path) -> dict[str, Any]:
    database = fresh_db(PHASE)
    port = free_port()
    up = CHILDREN.start("agentpay-upstream", [PYTHON, "-m", "bench.agentpay_upstream", str(port)], env=child_env(),
                        log=log_dir / "agentpay-upstream.log")
    wait_port(port, 30, up)
    upstream = f"http://127.0.0.1:{port}"
    try:
        seeded = seed(args.agentpay_wallets, upstream)
        result = {"throughput": throughput(args, database, seeded, out_dir),
                  "gateway": gateway(args, database, seeded, upstream, log_dir, out_dir)}
    finally:
        CHILDREN.stop(up)
    result["plot"] = plot(result, out_dir / "agentpay.png")
    return result


def table_rows(res: dict[str, Any], row: Any, judge: Any, smoke: bool) -> None:
    for r in res["throughput"]["runs"]:
        row(f"agentpay hold+capture, {r['wallets']}, c={r['clients']}",
            f"{r['calls_per_s']:.0f}/s vs pgbench {r['pgbench_tps']:.0f} tps = {r['ratio']:.0%}",
            ">= 25% of pgbench", judge(r["ratio"], r["ratio"] >= 0.25, smoke))
    g = res["gateway"]
    d, w = g["direct"], g["gateway"]
    row(f"agentpay gateway added p99 @ {g['offered_rate']:.0f}/s",
        f"{g['added_p99_ms']:.1f} ms (gateway p99 {w['p99_ms']:.1f} / p50 {w['p50_ms']:.1f} ms, {w['errors']} err; "
        f"direct p99 {d['p99_ms']:.1f} / p50 {d['p50_ms']:.1f} ms)", "added p99 < 10 ms, 0 errors",
        judge(g["added_p99_ms"], g["added_p99_ms"] < 10 and w["errors"] == 0, smoke))
    workers = g.get("gunicorn_workers", 2)
    busy = g["offered_rate"] * g["profile"]["ms_per_call"] / (1000 * workers)
    row("  (info) one gateway call's service time", f"{g['profile']['ms_per_call']:.1f} ms, "
        f"{g['profile']['queries_per_call']} queries, in one process, no HTTP server ({workers} workers at "
        f"{g['offered_rate']:.0f}/s: {busy:.0%} busy)", "added p99 < 10 ms needs headroom", "info")
    if w.get("cpu"):
        row("  (info) where the CPU went, gateway run (bench.cpu_accounting)", describe(w["cpu"]),
            "headroom for the tail", "info")


def plot(res: dict[str, Any], path: Path) -> str:
    """`agentpay.png`: throughput beside pgbench per case, and the latency distributions of the
    direct and the gateway runs with the added-p99 target marked. Never fails a finished run."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "not drawn (matplotlib missing)"
    try:
        fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
        runs = res["throughput"]["runs"]
        labels = [f"{r['wallets']}\nc={r['clients']}" for r in runs]
        xs = range(len(runs))
        left.bar([x - 0.2 for x in xs], [r["pgbench_tps"] for r in runs], 0.4, label="pgbench tpcb-like tps")
        left.bar([x + 0.2 for x in xs], [r["calls_per_s"] for r in runs], 0.4, label="hold+capture paid calls/s")
        left.plot([x + 0.2 for x in xs], [0.25 * r["pgbench_tps"] for r in runs], "k_", markersize=20,
                  label="target: 25 % of pgbench")
        left.set_xticks(list(xs), labels, fontsize=8)
        left.set_yscale("log")
        left.set_title("AgentPay hold + capture vs pgbench")
        left.legend(fontsize=7)
        g = res["gateway"]
        for label in ("direct", "gateway"):
            values = sorted(g[label]["latencies_ms"])
            right.plot(values, [(i + 1) / len(values) for i in range(len(values))],
                       label=f"{label} (p99 {g[label]['p99_ms']:.1f} ms)")
        right.axvline(g["direct"]["p99_ms"] + 10, linestyle="--", color="grey", linewidth=1)
        right.annotate("direct p99 + 10 ms", (g["direct"]["p99_ms"] + 10, 0.05), rotation=90, fontsize=7)
        right.set_xscale("log")
        right.set_xlabel("ms from due time")
        right.set_title(f"gateway vs direct at {g['offered_rate']:.0f}/s (cumulative)")
        right.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
    except Exception as exc:  # noqa: BLE001
        return f"not drawn: {exc!r}"
    return str(path)


if __name__ == "__main__":  # python -m bench.agentpay_bench RESULTS.json OUT.png: redraw from a run's JSON
    import sys

    print(plot(json.loads(Path(sys.argv[1]).read_text())["agentpay"], Path(sys.argv[2])))
