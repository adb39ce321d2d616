"""The paid phases' Celery workers (issue 21): one process per CPU by default, each with its own
pool, and the count named in the table row. No services: the worker start is stood in for."""

from __future__ import annotations

from typing import Any

from bench import realistic, services
from bench.run import parse_args


def test_the_paid_phases_run_one_worker_process_per_cpu_unless_told(monkeypatch):
    monkeypatch.setattr(realistic.os, "cpu_count", lambda: 2)
    assert parse_args(["--only", "burst_real"]).celery_processes == 2
    told = parse_args(["--only", "burst_real", "--celery-processes", "3", "--celery-concurrency", "8"])
    assert (told.celery_processes, told.real_celery_concurrency, told.celery_pool) == (3, 8, "threads")


def test_each_worker_process_gets_its_own_node_name_and_log(monkeypatch):
    started: list[dict[str, Any]] = []

    def fake_start(database: str, redis_url: str, api_base: str, concurrency: int, pool: str = "prefork",
                   index: int = 0) -> str:
        started.append({"concurrency": concurrency, "pool": pool, "index": index})
        return f"proc{index}"

    monkeypatch.setattr(services, "start_celery", fake_start)
    procs = services.start_celery_processes("db", "redis://x/13", "http://sim", 16, "threads", 2)
    assert procs == ["proc0", "proc1"]
    assert started == [{"concurrency": 16, "pool": "threads", "index": 0},
                       {"concurrency": 16, "pool": "threads", "index": 1}]


def _rows(name: str, result: dict[str, Any]) -> list[str]:
    rows: list[str] = []
    realistic.table_rows(name, result, lambda figure, value, target, verdict: rows.append(figure),
                         lambda value, ok, smoke: "PASS" if ok else "FAIL", False)
    return rows


def test_the_table_rows_name_the_worker_processes():
    burst = {"deliveries": 300, "drain_per_s": 90.0, "fraction_of_limit": 0.9, "rate_limit": 100.0, "restored": 300,
             "drain_seconds": 3.3, "rate_limited": 0, "accepted_200": 300, "target": 0.9, "reads_per_event": 1.0,
             "ceiling_per_s": 100.0, "celery_pool": "threads", "celery_concurrency": 16, "celery_processes": 2}
    assert _rows("burst_real", burst)[0] == "burst_real 300 drain rate (celery threads x 16, 2 processes)"
    sustained = {"rate": 50.0, "seconds": 120.0, "p99_s": 1.5, "p50_s": 0.5, "restored": 10, "deliveries": 10,
                 "accepted_200": 10, "rate_limited": 0, "p99_target_s": 2.0, "celery_pool": "threads",
                 "celery_concurrency": 16}  # written before --celery-processes: one process
    assert _rows("paid_sustained", sustained)[0] == "paid->FULL p99, 50/s for 120 s (celery threads x 16, 1 process)"
