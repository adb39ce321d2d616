"""The grace sweep with its provider fetches in flight on several threads (issue 21,
DUNNING_PROVIDER_IO_THREADS): the same acceptances as the sequential sweep, claims in due order,
exact counters, 429s retried, a fetch that gives up counted, every thread's connection closed.
Real HTTP to the simulator with a small latency and a low rate limit; no timing assertions."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction

from dunning.jobs import row_pool
from dunning.jobs.framework import JobReport, job_run
from dunning.models import DunningCycle
from dunning.models import TransitionReceipt as Receipt
from tests.jobs.test_concurrency import run_concurrently
from tests.support.scenarios import cycle_of, failed_renewal
from tests.verification.fake_stripe.realism import NetworkProfile

pytestmark = pytest.mark.django_db(transaction=True)

SLOW_AND_LIMITED = NetworkProfile(latency_ms=40, latency_spread_ms=10, read_rate=20, write_rate=20, seed=5)
SWEPT = ("expire_grace", "begin_restriction", "complete_restriction")


def due_cycles(sim, time_machine, n: int) -> list[str]:
    """`n` cycles whose grace has ended, the simulator slow and rate-limited from now on."""
    invoices = [failed_renewal(sim)[1] for _ in range(n)]
    time_machine.move_to(max(cycle_of(i).grace_expires_at for i in invoices) + timedelta(minutes=1), tick=True)
    sim.network.configure(SLOW_AND_LIMITED)
    return invoices


def signature(invoice_id: str) -> list[tuple]:
    """What the job's acceptances decided for one cycle, without ids and times."""
    return list(Receipt.objects.filter(cycle=cycle_of(invoice_id)).order_by("pk").values_list(
        "edge", "accepted", "from_state", "to_state", "rejection_reason", "decision_profile",
        "evidence_receipt__status", "cause_kind"))


def backends() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
        return cursor.fetchone()[0]


def test_threads_restrict_each_due_cycle_once_with_the_sequential_sweeps_acceptances(sim, time_machine, settings):
    time_machine.move_to("2026-12-01T09:00:00Z", tick=True)
    settings.DUNNING_PROVIDER_IO_THREADS = 1
    sequential = due_cycles(sim, time_machine, 4)
    run_one = job_run("grace_expiry")
    sim.network.configure(NetworkProfile())

    settings.DUNNING_PROVIDER_IO_THREADS = 4
    threaded = due_cycles(sim, time_machine, 9)
    connected = backends()
    run_many = job_run("grace_expiry")

    assert (run_one.examined, run_one.changed, run_one.refused, run_one.errors) == (4, 12, 0, 0), run_one.detail
    assert (run_many.examined, run_many.changed, run_many.refused, run_many.errors) == (9, 27, 0, 0), run_many.detail
    assert sim.network.stats()["read"] == 9, "one provider request per fresh fetch"
    expected = signature(sequential[0])
    assert [edge for edge, accepted, *_ in expected if accepted][-3:] == list(SWEPT)
    for invoice_id in sequential + threaded:
        assert cycle_of(invoice_id).state == "RESTRICTED"
        assert signature(invoice_id) == expected
    assert backends() == connected, "every thread closed its connection when the job ended"


def test_rows_are_claimed_in_due_order_and_the_claims_released(sim, time_machine, settings, monkeypatch):
    time_machine.move_to("2026-12-01T09:00:00Z", tick=True)
    settings.DUNNING_PROVIDER_IO_THREADS = 3
    invoices = due_cycles(sim, time_machine, 7)
    claimed: list[int] = []
    real_claim = row_pool.claim_try

    def recording_claim(name: str, pk: int) -> bool:
        claimed.append(pk)
        return real_claim(name, pk)

    monkeypatch.setattr(row_pool, "claim_try", recording_claim)
    run = job_run("grace_expiry")

    swept = DunningCycle.objects.filter(invoice__provider_invoice_id__in=invoices)
    in_due_order = list(swept.order_by("grace_expires_at", "pk").values_list("pk", flat=True))
    assert claimed == in_due_order
    assert run.changed == 7 * 3
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()")
        assert cursor.fetchone()[0] == 0


def test_two_threaded_runs_at_once_share_the_rows_without_accepting_any_twice(sim, time_machine, settings):
    time_machine.move_to("2026-12-01T09:00:00Z", tick=True)
    settings.DUNNING_PROVIDER_IO_THREADS = 3
    invoices = due_cycles(sim, time_machine, 10)

    runs = run_concurrently("grace_expiry")

    assert sum(r.changed for r in runs) == 10 * 3, [(r.changed, r.detail) for r in runs]
    assert sum(r.refused for r in runs) == 0 and sum(r.errors for r in runs) == 0
    for invoice_id in invoices:
        cycle = cycle_of(invoice_id)
        assert cycle.state == "RESTRICTED"
        accepted = Receipt.objects.filter(cycle=cycle, accepted=True, edge__in=SWEPT).values_list("edge", flat=True)
        assert sorted(accepted) == sorted(SWEPT)
        assert not Receipt.objects.filter(cycle=cycle, accepted=False).exists(), "claims keep the runs apart"


def test_a_429_storm_is_retried_and_a_fetch_that_gives_up_is_an_error_with_a_note(sim, time_machine, settings):
    time_machine.move_to("2026-12-01T09:00:00Z", tick=True)
    settings.DUNNING_PROVIDER_IO_THREADS = 4
    # Room for one fetch to meet every storm 429 in a row (back-off 0.25 + 0.5 + 1 + 2 s at most) on a
    # loaded machine; the stuck invoice still gives up within it.
    settings.STRIPE_RATE_LIMIT_RETRY_SECONDS = 4
    invoices = due_cycles(sim, time_machine, 6)
    stuck = invoices[2]
    storm = sim.faults.rate_limit("GET /v1/invoices/*", count=4)
    never = sim.faults.rate_limit(f"GET /v1/invoices/{stuck}", count=10_000)

    run = job_run("grace_expiry")

    assert storm.fired == 4 and never.fired >= 2
    assert (run.errors, run.refused, run.status) == (1, 0, "PARTIAL"), run.detail
    assert run.changed == 5 * 3 + 1, "the stuck cycle's grace expired; it waits for a fetch to be restricted"
    (note,) = [line for line in run.detail.splitlines() if "fetch failed" in line]
    assert note.startswith(f"cycle {cycle_of(stuck).cycle_id}: fetch failed, nothing changed, retried next run: ")
    assert "rate-limited" in note
    assert cycle_of(stuck).state == "GRACE_EXPIRED"
    assert all(cycle_of(i).state == "RESTRICTED" for i in invoices if i != stuck)


def test_a_rows_exception_stops_the_sweep_after_the_rows_in_flight_and_releases_every_claim(db):
    done: list[int] = []

    def work(part: JobReport, pk: int) -> None:
        if pk == 3:
            raise RuntimeError("row 3 broke")
        part.changed += 1
        done.append(pk)

    run = JobReport(job="test", now=None)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="row 3 broke"):
        row_pool.claimed_in_threads(run, range(1, 200), "test-claims", work, threads=2)
    assert 3 not in done and len(done) < 198, "no new row is handed out once one failed"
    assert run.changed == len(done)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()")
        assert cursor.fetchone()[0] == 0


def test_a_job_inside_a_transaction_or_set_to_one_thread_stays_sequential(db, settings):
    settings.DUNNING_PROVIDER_IO_THREADS = 6
    assert row_pool.provider_io_threads() == 6
    settings.DUNNING_PROVIDER_IO_THREADS = 1
    assert row_pool.provider_io_threads() == 1
    settings.DUNNING_PROVIDER_IO_THREADS = 6
    with transaction.atomic():
        assert row_pool.provider_io_threads() == 1
