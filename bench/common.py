"""Shared plumbing for the bench: progress lines, databases, child processes, ports, statistics.

Nothing here imports Django at module level: the sweep and acceptance workers import it after
they have set DATABASE_URL.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
VENV_BIN = Path(PYTHON).parent
PG_HOST = os.environ.get("BENCH_PG_HOST", "127.0.0.1")
PG_PORT = int(os.environ.get("BENCH_PG_PORT", "5432"))
PG_USER = os.environ.get("BENCH_PG_USER", "postgres")
# Another prefix lets two checkouts bench one server; it must start with "bench_", the mark of a
# database the bench may drop.
DB_PREFIX = os.environ.get("BENCH_DB_PREFIX", "bench_dunning")
if not DB_PREFIX.startswith("bench_"):
    raise SystemExit(f"BENCH_DB_PREFIX must start with 'bench_' (got {DB_PREFIX!r})")
SECRET = "whsec_bench"
ACCOUNT = "acct_demo"
PRICE = "price_monthly_pro"
# The renewal decline seeded everywhere: hard, so the provider schedules no retry and grace runs out.
HARD_DECLINE = "expired_card"
_T0 = time.monotonic()


def db_url(name: str) -> str:
    return f"postgres://{PG_USER}@{PG_HOST}:{PG_PORT}/{name}"


def elapsed() -> float:
    """Seconds since the bench began (the clock of `say` and of the speed probe)."""
    return time.monotonic() - _T0


def say(phase: str, message: str) -> None:
    elapsed = int(time.monotonic() - _T0)
    print(f"[bench {elapsed // 60:02d}:{elapsed % 60:02d}] {phase}: {message}", flush=True)


class Ticker:
    """Progress for a long wait: at most one line every `every` seconds."""

    def __init__(self, phase: str, every: float = 2.0) -> None:
        self.phase, self.every, self.last = phase, every, 0.0

    def __call__(self, message: str, *, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last >= self.every:
            self.last = now
            say(self.phase, message)


# ---- databases (admin connection to the maintenance database) -------------------------------

def _admin():  # noqa: ANN202
    import psycopg

    return psycopg.connect(host=PG_HOST, port=PG_PORT, user=PG_USER, dbname="postgres", autocommit=True)


def db_drop(name: str) -> None:
    assert name.startswith("bench_"), name
    with _admin() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


_CREATED: set[str] = set()


def db_create(name: str, template: str | None = None) -> None:
    assert name.startswith("bench_"), name
    db_drop(name)
    with _admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
    _CREATED.add(name)


def db_created() -> list[str]:
    """The databases this run created: the only ones its clean-up drops (another checkout's
    bench, under another BENCH_DB_PREFIX, may share the server and even a name prefix)."""
    return sorted(_CREATED)


def use_db(name: str) -> None:
    """Point this process's Django default connection at another bench database."""
    from django.conf import settings
    from django.db import connections

    connections.close_all()
    settings.DATABASES["default"]["NAME"] = name
    connections["default"].settings_dict["NAME"] = name


# ---- child processes ----------------------------------------------------------------------------

class Children:
    """Every process the bench starts, each in its own session so it can be stopped as a group
    (gunicorn and celery fork workers). Stopped on exit, on Ctrl-C and on SIGTERM."""

    def __init__(self) -> None:
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, argv: Sequence[str], *, env: dict[str, str], log: Path | None = None,
              stdout: int | IO[Any] | None = None) -> subprocess.Popen:
        out: Any = stdout
        if out is None:
            out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(list(argv), cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT if log or stdout is None else None,
                                start_new_session=True)
        self.procs.append((name, proc))
        return proc

    def stop(self, proc: subprocess.Popen, timeout: float = 10.0) -> None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        else:  # the leader is gone; make sure no forked worker of its group is left behind
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        self.procs = [(n, p) for n, p in self.procs if p is not proc]

    def stop_all(self) -> None:
        for _, proc in list(reversed(self.procs)):
            self.stop(proc, timeout=5.0)


CHILDREN = Children()


@contextlib.contextmanager
def without_collector_pauses() -> Iterator[None]:
    """A load generator's timed run with Python's cyclic collector off. Its heap holds every
    request's coroutine from the start (asyncio.gather), and a full collection in it (10-20 ms on
    the 2026-12-04 machine, seen in the 402 run with gc.callbacks) stalled the event loop: every
    request in flight then looked that much slower. That is the bench's pause, not the server's.
    What the run leaves is collected afterwards."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
        gc.collect()


def write_back_dirty_pages(phase: str) -> dict[str, float]:
    """Before a timed window, write what the phase's setup left dirty to disk: PostgreSQL's shared
    buffers (``CHECKPOINT``), then the page cache (``sync``); say how much the page cache held.

    A phase's setup writes without waiting for the disk: pgbench -i and its runs, the database copied
    from its template, the seeding (about 150 MB on 2026-12-04). Two costs of that landed in the
    gateway's window, neither the code under test's:
    - Linux writes data back once it is 30 s old, in one burst; the burst took the disk for 70-90 ms,
      and every PostgreSQL commit waited behind it in its WAL fsync (pg_stat_activity: WALSync;
      /proc/meminfo: Dirty falling into Writeback at that moment): one 80 ms stall a run.
    - The 128 MB of shared buffers held the earlier phases' dirty pages, and PostgreSQL's background
      writer wrote them out during the window (pg_stat_bgwriter.buffers_clean: 1,860 buffers in one
      15 s gateway window; none after the CHECKPOINT). One full-size run each way on 2026-12-04:
      added p99 11.6 ms without it, 8.4 and 8.8 ms with it: suggestive, not proof.
    A server's own steady writing is still in the window: this only settles the setup's."""
    dirty_kb = _meminfo_kb("Dirty")
    began = time.monotonic()
    with _admin() as conn:
        conn.execute("CHECKPOINT")
    os.sync()
    seconds = time.monotonic() - began
    if dirty_kb > 10_000 or seconds > 0.5:
        say(phase, f"checkpoint and {dirty_kb / 1024:.0f} MB of dirty page cache written back before the window "
                   f"({seconds:.2f} s)")
    return {"dirty_mb": round(dirty_kb / 1024, 1), "seconds": round(seconds, 3)}


def _meminfo_kb(field: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, _, value = line.partition(":")
        if name == field:
            return int(value.split()[0])
    return 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process {proc.args!r} exited with {proc.returncode} before listening")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listening on port {port} after {timeout} s")


def gunicorn_argv(port: int, processes: int, threads: int = 1) -> list[str]:
    """The product's web server as the README's Production section runs it: ``--preload`` loads the
    app (and freezes its heap, config/startup_heap.py) in the master before it binds the port and
    forks, so every worker answers from the moment `wait_port` returns. Without it the port was bound
    at once and each worker spent about 1.5 s importing, and a phase's first second queued behind that
    (the gateway's 70-80 ms stall about 1 s into the window, 2026-12-04). ``threads`` > 1: gthread."""
    worker = ["--worker-class", "sync"] if threads <= 1 else ["--worker-class", "gthread", "--threads", str(threads)]
    return [str(VENV_BIN / "gunicorn"), "config.wsgi:application", "--preload", "--workers", str(processes), *worker,
            "--bind", f"127.0.0.1:{port}", "--log-level", "warning", "--graceful-timeout", "5"]


def child_env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    env.update({"DJANGO_SETTINGS_MODULE": "config.settings", "STRIPE_WEBHOOK_SECRETS": SECRET,
                "STRIPE_WEBHOOK_SECRET": SECRET, "STRIPE_ACCOUNT": ACCOUNT, "DJANGO_DEBUG": "0",
                "LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1"})
    env.update(overrides)
    return env


def peak_rss_kb(pid: int) -> int:
    """VmHWM of a live process (its peak resident set so far), in KiB; 0 when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


# ---- statistics ----------------------------------------------------------------------------------

def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


class SpeedProbe:
    """Times a fixed 10^7-iteration Python loop every `every` seconds for the whole run: this
    machine's speed drifts by up to 2x over minutes, and a figure is only read right beside the
    speed it was taken at. Each probe costs about 0.3 s of one CPU."""

    LOOP = 10**7

    def __init__(self, every: float = 120.0) -> None:
        import threading

        self.every = every
        self.samples: list[tuple[float, float]] = []  # (seconds since the bench began, loop seconds)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="speed-probe", daemon=True)

    def start(self) -> SpeedProbe:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.every)

    def sample(self) -> None:
        self.samples.append((time.monotonic() - _T0, self.measure()))

    @classmethod
    def measure(cls) -> float:
        """In a child process: a loop in this one would hold the GIL of the load generator whose
        latencies it sits beside."""
        code = (f"import time\nt = time.perf_counter()\nfor _ in range({cls.LOOP}): pass\n"
                "print(time.perf_counter() - t)")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        return float(out.stdout)

    def stop(self) -> list[tuple[float, float]]:
        self._stop.set()
        self._thread.join(timeout=5)
        return list(self.samples)

    def between(self, start: float, end: float) -> list[float]:
        return [s for t, s in self.samples if start <= t <= end]
