"""The services a bench phase runs against: the template database and a fresh copy per phase, the
Stripe simulator subprocess, gunicorn, a Celery worker and the Redis database the bench owns.
Django is imported inside the functions: the bench sets DATABASE_URL before django.setup()."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Sequence
from typing import Any

from bench.common import (
    CHILDREN,
    DB_PREFIX,
    HARD_DECLINE,
    PYTHON,
    ROOT,
    VENV_BIN,
    Ticker,
    child_env,
    db_create,
    db_url,
    free_port,
    gunicorn_argv,
    say,
    use_db,
    wait_port,
)

TEMPLATE = f"{DB_PREFIX}_template"
OUT_DIR = ROOT / "var" / "bench"
LOG_DIR = OUT_DIR / "logs"
# Threads per gunicorn worker process in the webhook phase (start_gunicorn's `threads`; 1 = sync workers).
WEBHOOK_GUNICORN_THREADS = 4


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


def start_simulator(count: int, *, paid: bool, tag: str, network: Sequence[str] = ()
                    ) -> tuple[subprocess.Popen, str, list[dict[str, Any]]]:
    """``network``: bench.simproc's realism flags (``--network live --latency-ms 150 ...``); none = instant."""
    out = OUT_DIR / f"sim_{tag}.json"
    argv = [PYTHON, "-m", "bench.simproc", "--count", str(count), "--out", str(out), *network] + (
        ["--paid"] if paid else [])
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


def start_gunicorn(database: str, redis_url: str, *, api_base: str = "", per_request_connections: bool = False,
                   threads: int = 1) -> tuple[subprocess.Popen, str]:
    """gunicorn on the product's settings, 2 worker processes; ``per_request_connections`` sets
    DB_CONN_MAX_AGE=0 (a new PostgreSQL connection per request) for the informational comparison.

    ``threads`` > 1 runs gthread workers: a delivery spends most of its time waiting for
    PostgreSQL's commit (the WAL flush) and Redis, and a sync worker holds the request queue for
    that whole wait, while threads let the next request be parsed and run meanwhile (concurrent
    commits also share one flush). 1 is the sync worker. No access log (gunicorn's default)."""
    port = free_port()
    env = child_env(DATABASE_URL=db_url(database), REDIS_URL=redis_url, ALLOWED_HOSTS="127.0.0.1,localhost",
                    **({"STRIPE_API_BASE": api_base} if api_base else {}),
                    **({"DB_CONN_MAX_AGE": "0"} if per_request_connections else {}))
    proc = CHILDREN.start("gunicorn", gunicorn_argv(port, 2, threads), env=env, log=LOG_DIR / "gunicorn.log")
    wait_port(port, 30, proc)
    return proc, f"http://127.0.0.1:{port}/webhooks/stripe/"


def start_celery(database: str, redis_url: str, api_base: str, concurrency: int, pool: str = "prefork",
                 index: int = 0) -> subprocess.Popen:
    """A real worker on the broker; ``pool`` prefork (processes) or threads (one process, provider waits overlap).
    ``index`` tells the workers of one phase apart: their own node name and log (celery.log, celery-1.log, …)."""
    log = LOG_DIR / ("celery.log" if index == 0 else f"celery-{index}.log")
    log.write_text("")
    env = child_env(DATABASE_URL=db_url(database), REDIS_URL=redis_url, STRIPE_API_BASE=api_base)
    argv = [str(VENV_BIN / "celery"), "-A", "config", "worker", "-P", pool, "-c", str(concurrency),
            "-l", "INFO", "--without-gossip", "--without-mingle", "--without-heartbeat",
            "-n", f"bench{os.getpid()}-{index}@%h"]
    proc = CHILDREN.start("celery" if index == 0 else f"celery-{index}", argv, env=env, log=log)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"celery worker exited ({proc.returncode}); see {log}")
        if " ready." in log.read_text(errors="replace"):
            return proc
        time.sleep(0.2)
    raise RuntimeError(f"celery worker not ready after 60 s; see {log}")


def start_celery_processes(database: str, redis_url: str, api_base: str, concurrency: int, pool: str,
                           processes: int) -> list[subprocess.Popen]:
    """``processes`` workers on the same queue, each with its own pool of ``concurrency``: a thread
    pool runs Python on one core (the GIL), so a second core needs a second process."""
    return [start_celery(database, redis_url, api_base, concurrency, pool=pool, index=i) for i in range(processes)]


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

