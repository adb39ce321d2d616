"""bench.cpu_accounting: the arithmetic behind "where the CPU went", and one real sample."""

from __future__ import annotations

import time

from bench.cpu_accounting import TICKS, CpuAccount, describe, machine_ticks, party_of, process_ticks, summarise


def test_parties_by_command_line():
    assert party_of("postgres: postgres bench_x 127.0.0.1(5555) idle") == "postgresql"
    assert party_of("/v/bin/python -m bench.sweep_worker --measure") == "sweep workers"
    assert party_of("/v/bin/python -m bench.simproc --network live") == "simulator"
    assert party_of("/v/bin/python -m celery -A config worker") == "celery"
    assert party_of("/v/bin/python -m bench --only sweep_real") == "load generator (bench)"
    assert party_of("/usr/bin/redis-server 127.0.0.1:6379") == "redis"
    # The gateway bench's upstream is started with -m bench.agentpay_upstream: not the load generator.
    assert party_of("/v/bin/python -m bench.agentpay_upstream 4567") == "upstream (bench)"
    assert party_of("/root/.anvil/bin/anvil --port 8545 --block-time 1") == "anvil"
    assert party_of("sshd: root") == "other"


def test_proc_stat_parsing_counts_busy_and_idle_and_a_name_with_spaces():
    # user nice system idle iowait irq softirq steal
    assert machine_ticks("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3") == (150, 1000)
    assert process_ticks("42 (gunicorn: wor) ker) S 1 2 3 4 5 6 7 8 9 10 31 7 0 0") == 38


def test_summary_splits_busy_cpu_by_party_per_unit_and_keeps_the_remainder():
    per_second = TICKS
    summary = summarise(start=(0, 0), end=(18 * per_second, 20 * per_second),  # 10 s of 2 cores, 90 % busy
                        first={1: 0, 2: 5 * per_second, 3: 0}, last={1: 8 * per_second, 2: 11 * per_second,
                                                                    3: 3 * per_second},
                        party={1: "sweep workers", 2: "postgresql", 3: "sweep workers"}, cores=2,
                        units=1000, unit="cycle")
    assert summary["busy_fraction"] == 0.9
    assert summary["wall_seconds"] == 10
    assert summary["cpu_seconds_by_party"] == {"sweep workers": 11.0, "postgresql": 6.0, "unattributed": 1.0}
    assert summary["cpu_ms_per_unit"]["sweep workers"] == 11.0
    assert summary["cpu_floor_seconds"] == 9.0
    line = describe(summary)
    assert "2 cores 90% busy" in line and "18.0 in all" in line and "sweep workers 11.0" in line


def test_a_real_sample_sees_this_process_burn_cpu():
    with CpuAccount(interval=0.05) as cpu:
        end = time.process_time() + 0.3
        while time.process_time() < end:
            pass
    summary = cpu.summary(units=1, unit="run")
    assert summary["busy_cpu_seconds"] >= 0.25
    assert sum(summary["cpu_seconds_by_party"].values()) >= 0.25
