"""The AgentPay bench's table rows name the gateway's gunicorn processes and count the busy share
over them (BENCH_GATEWAY_WORKERS), not over a fixed two."""

from __future__ import annotations

from bench import agentpay_bench


def _rows(result: dict) -> dict[str, str]:
    seen: dict[str, str] = {}
    agentpay_bench.table_rows(result, lambda figure, value, *_: seen.__setitem__(figure.strip(), value),
                              lambda *_: "PASS", False)
    return seen


def _result(workers: int | None) -> dict:
    run = {"p99_ms": 5.0, "p50_ms": 2.0, "errors": 0}
    gateway = {"offered_rate": 200.0, "direct": run, "gateway": run, "added_p99_ms": 0.0,
               "profile": {"ms_per_call": 5.0, "queries_per_call": 10}}
    if workers is not None:
        gateway["gunicorn_workers"] = workers
    return {"throughput": {"runs": []}, "gateway": gateway}


def test_the_service_time_row_counts_the_busy_share_over_the_workers_the_run_had(monkeypatch):
    assert "(4 workers at 200/s: 25% busy)" in _rows(_result(4))["(info) one gateway call's service time"]
    # A result written before the count was recorded had two.
    assert "(2 workers at 200/s: 50% busy)" in _rows(_result(None))["(info) one gateway call's service time"]


def test_the_worker_count_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("BENCH_GATEWAY_WORKERS", raising=False)
    assert agentpay_bench.gateway_workers() == 2
    monkeypatch.setenv("BENCH_GATEWAY_WORKERS", "5")
    assert agentpay_bench.gateway_workers() == 5
