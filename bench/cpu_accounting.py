"""Where the machine's CPU went during a phase: the evidence for "what bounds this figure".

The realistic phases (sweep_real, paid_sustained, burst_real) run every party on the same cores:
our workers, PostgreSQL's backends, the provider simulator, gunicorn, Celery and Redis. A wall
time above the provider's rate-limit floor is bound by CPU when the cores were (nearly) all busy,
and then the per-party CPU per unit of work says whose milliseconds to cut. The machine's busy
share comes from /proc/stat (exact); the per-party split from every process's utime + stime in
/proc/<pid>/stat, sampled every `interval` seconds (a process that exits loses at most its last
interval: what the split misses shows as `unattributed`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TICKS = os.sysconf("SC_CLK_TCK")
PROC = Path("/proc")

# First match wins; matched against the process's command line (and its name for kernel-named ones).
PARTIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("postgresql", ("postgres",)),
    ("sweep workers", ("bench.sweep_worker",)),
    ("simulator", ("bench.simproc",)),
    ("gunicorn", ("gunicorn",)),
    ("celery", ("celery",)),
    ("redis", ("redis-server",)),
    ("upstream (bench)", ("bench.agentpay_upstream",)),
    ("anvil", ("anvil",)),
    ("load generator (bench)", ("-m bench", "bench/__main__")),
)


def party_of(cmdline: str) -> str:
    for party, needles in PARTIES:
        if any(needle in cmdline for needle in needles):
            return party
    return "other"


def machine_ticks(stat_text: str) -> tuple[int, int]:
    """(busy, total) jiffies from /proc/stat's first line; iowait counts as idle."""
    fields = [int(v) for v in stat_text.splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    total = sum(fields[:8])  # guest time is already inside user/nice
    return total - idle, total


def process_ticks(stat_text: str) -> int:
    """utime + stime of one /proc/<pid>/stat (the name field may hold spaces and parentheses)."""
    after_name = stat_text.rsplit(")", 1)[1].split()
    return int(after_name[11]) + int(after_name[12])


@dataclass
class CpuAccount:
    """Sample while a phase runs: `with CpuAccount() as cpu: ...`, then `cpu.summary(units)`."""

    interval: float = 0.5
    _start_machine: tuple[int, int] = (0, 0)
    _end_machine: tuple[int, int] = (0, 0)
    _first: dict[int, int] = field(default_factory=dict)  # pid -> ticks when first seen
    _last: dict[int, int] = field(default_factory=dict)  # pid -> ticks when last seen
    _party: dict[int, str] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> CpuAccount:
        self._start_machine = machine_ticks((PROC / "stat").read_text())
        self._sample(first=True)
        self._thread = threading.Thread(target=self._run, name="cpu-account", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
        self._end_machine = machine_ticks((PROC / "stat").read_text())

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def _sample(self, first: bool = False) -> None:
        for pid in _pids():
            try:
                ticks = process_ticks((PROC / str(pid) / "stat").read_text())
                if pid not in self._party:
                    cmdline = (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                        "utf-8", "replace")
                    self._party[pid] = party_of(cmdline)
            except (OSError, IndexError, ValueError):
                continue  # gone between listing and reading
            # A process born during the phase counts from 0; one alive at the start from then.
            self._first.setdefault(pid, ticks if first else 0)
            self._last[pid] = ticks

    def summary(self, units: int = 0, unit: str = "unit") -> dict[str, Any]:
        return summarise(self._start_machine, self._end_machine, self._first, self._last, self._party,
                         os.cpu_count() or 1, units, unit)


def _pids() -> Iterable[int]:
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            yield int(entry.name)


def summarise(start: tuple[int, int], end: tuple[int, int], first: dict[int, int], last: dict[int, int],
              party: dict[int, str], cores: int, units: int, unit: str) -> dict[str, Any]:
    """The arithmetic, apart from /proc so that it can be tested."""
    busy, total = end[0] - start[0], end[1] - start[1]
    wall = total / TICKS / cores if total else 0.0
    by_party: dict[str, float] = {}
    for pid, ticks in last.items():
        used = (ticks - first.get(pid, 0)) / TICKS
        if used > 0:
            by_party[party[pid]] = by_party.get(party[pid], 0.0) + used
    busy_s = busy / TICKS
    attributed = sum(by_party.values())
    by_party["unattributed"] = max(0.0, busy_s - attributed)
    out: dict[str, Any] = {
        "cores": cores, "wall_seconds": wall, "busy_cpu_seconds": busy_s,
        "busy_fraction": busy / total if total else None,
        "cpu_seconds_by_party": dict(sorted(by_party.items(), key=lambda kv: -kv[1])),
        # If the work had been spread perfectly over every core, it could not have finished sooner.
        "cpu_floor_seconds": busy_s / cores, "units": units, "unit": unit,
    }
    if units:
        out["cpu_ms_per_unit"] = {k: 1000 * v / units for k, v in out["cpu_seconds_by_party"].items()}
        out["busy_cpu_ms_per_unit"] = 1000 * busy_s / units
    return out


def describe(summary: dict[str, Any], top: int = 4) -> str:
    """One line for the table: busy share, and the CPU per unit of the largest parties."""
    share = summary.get("busy_fraction")
    head = f"{summary['cores']} cores {share:.0%} busy over {summary['wall_seconds']:.0f} s" if share is not None \
        else "no samples"
    per = summary.get("cpu_ms_per_unit")
    if not per:
        return head
    parts = [f"{name} {ms:.1f}" for name, ms in list(per.items())[:top] if ms >= 0.05]
    return (f"{head}; CPU ms per {summary['unit']}: {summary['busy_cpu_ms_per_unit']:.1f} in all ("
            + ", ".join(parts) + f"); all cores busy for this CPU alone: {summary['cpu_floor_seconds']:.0f} s")
