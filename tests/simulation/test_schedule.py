"""The seeded schedule itself (no database): deterministic per seed, every step kind and both
provider retry profiles drawn over the CI seeds, and a printed replay that reads back as the
same schedule."""

from __future__ import annotations

from collections import Counter

from tests.verification.simulation import WEIGHTS, Schedule, Step, generate
from tests.verification.simulation.schedule import PROVIDER_RETRIES

CI_SEEDS = range(1, 11)


def test_same_seed_same_schedule():
    assert generate(5, 300) == generate(5, 300)
    assert generate(5, 300) != generate(6, 300)


def test_ci_seeds_draw_every_step_kind_and_both_retry_profiles():
    schedules = [generate(seed, 1000) for seed in CI_SEEDS]
    kinds = Counter(step.kind for schedule in schedules for step in schedule.steps)
    assert set(kinds) == set(WEIGHTS), f"never drawn: {set(WEIGHTS) - set(kinds)}"
    for kind in ("cancel", "end_period", "pause", "resume", "change_plan", "jobs_ahead", "soft_decline"):
        assert kinds[kind] >= 30, (kind, kinds[kind])
    assert {s.provider_retries for s in schedules} == set(PROVIDER_RETRIES)


def test_smart_retries_outlast_a_seven_day_grace():
    gaps, tries = PROVIDER_RETRIES["smart-14d"]
    assert tries == 8 and sum(gaps) == 14 * 86400
    assert sum(gaps[:4]) < 7 * 86400 < sum(gaps), "some retries before the grace end, some after"


def test_replay_literal_reads_back():
    schedule = generate(9, 40)
    assert eval(schedule.as_python(), {"Schedule": Schedule, "Step": Step}) == schedule  # noqa: S307


def test_a_job_period_interrupted_by_an_outage_runs_again_from_its_end():
    from datetime import timedelta

    from tests.verification.simulation import EPOCH, Simulation

    sim = Simulation(generate(1, 10))
    minute = timedelta(seconds=60)
    sim.outages, sim.gaps = [], []
    assert sim.scheduler_due(EPOCH, minute) == EPOCH + minute
    sim.outages = [(EPOCH + timedelta(seconds=2), EPOCH + timedelta(days=4))]  # down 2 s after the deadline
    assert sim.scheduler_due(EPOCH, minute) == EPOCH + timedelta(days=4) + minute
    sim.gaps = [(EPOCH + timedelta(days=4, seconds=30), EPOCH + timedelta(days=5))]  # and jumped again
    assert sim.scheduler_due(EPOCH, minute) == EPOCH + timedelta(days=5) + minute
    assert sim.scheduler_due(EPOCH - timedelta(hours=1), minute) == EPOCH - timedelta(hours=1) + minute
