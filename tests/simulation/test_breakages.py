"""The auditor catches deliberately broken builds. Each test monkeypatches one breakage into
the product for its duration and asserts the auditor names it."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from dunning.services import edges, recompute
from dunning.simulation import Simulation, generate
from dunning.simulation.shrink import shrink


def _codes(w) -> set[str]:
    return {v.code for v in w.violations}


def _two_invoices_one_paid(world):
    with world("standard") as w:
        first = w.failed_renewal(0, "stolen_card")
        w.audit()
        w.failed_renewal(0, "stolen_card")
        w.audit()
        w.sim.customer_pays(first)
        w.deliver()
        w.audit()
    return w


def test_root_recompute_skipped_is_caught(world, monkeypatch):
    real = recompute.compute_aggregate

    def keep_old_root(subscription, changed_cycle):
        _, decision = real(subscription, changed_cycle)
        return subscription.outstanding_cycle_root, decision

    monkeypatch.setattr(recompute, "compute_aggregate", keep_old_root)
    w = _two_invoices_one_paid(world)
    assert "ROOT_MISMATCH" in _codes(w)


def test_fresh_idempotency_key_per_call_is_caught(world, monkeypatch):
    monkeypatch.setattr(edges, "local_idempotency_key", lambda cycle_id, n: f"fresh-{uuid.uuid4()}")
    with world("local") as w:
        invoice = w.failed_renewal()
        w.run_jobs(only=("local_retries",))
        w.move_to(w.cycle(invoice).next_attempt_at + timedelta(seconds=1))
        w.sim.faults.timeout("POST /v1/invoices/*/pay", apply=True, hold_seconds=0.01)
        w.run_jobs(only=("local_retries",))
        w.audit()
        w.advance(600)
    assert "BLIND_RETRY" in _codes(w)


def test_restriction_without_fresh_receipt_is_caught(world, monkeypatch):
    from dunning.jobs import cycle_jobs
    from dunning.services.results import Evidence

    monkeypatch.setattr(edges, "require_fresh_invoice_receipt", lambda *a, **k: None)
    monkeypatch.setattr(cycle_jobs, "receipt_evidence", lambda inv, receipt: Evidence())
    with world("standard") as w:
        w.failed_renewal(0, "stolen_card")
        w.advance(8 * 86400)
    assert "RESTRICTION_WITHOUT_FRESH_RECEIPT" in _codes(w)


def test_unowned_unknown_payment_is_caught(world, monkeypatch):
    from dunning.jobs import cycle_jobs

    monkeypatch.setattr(cycle_jobs, "unknown_owner_pick", lambda: None)
    with world("local") as w:
        invoice = w.failed_renewal()
        w.run_jobs(only=("local_retries",))
        w.move_to(w.cycle(invoice).next_attempt_at + timedelta(seconds=1))
        w.sim.faults.error_500("POST /v1/invoices/*/pay", apply=False, count=1000)
        w.run_jobs(only=("local_retries",))
        w.advance(2 * 3600)
        w.audit()
    assert "UNKNOWN_NOT_OWNED" in _codes(w)


def test_full_while_blocking_is_caught(world, monkeypatch):
    from dunning.aggregate import Decision

    real = recompute.compute_aggregate
    always_full = Decision(profile="FULL", reason="broken build", blocking_count=0)
    monkeypatch.setattr(recompute, "compute_aggregate", lambda sub, cycle: (real(sub, cycle)[0], always_full))
    w = _two_invoices_one_paid(world)
    assert "FULL_WHILE_BLOCKING" in _codes(w)


@pytest.mark.django_db
def test_random_schedule_catches_a_broken_build_and_shrinks_it(monkeypatch):
    real = recompute.compute_aggregate
    monkeypatch.setattr(recompute, "compute_aggregate",
                        lambda sub, cycle: (sub.outstanding_cycle_root, real(sub, cycle)[1]))
    schedule = generate(7, 120)
    result = Simulation(schedule).run()
    assert result.first is not None and result.first.code == "ROOT_MISMATCH"
    small = shrink(schedule, "ROOT_MISMATCH", failing_step=result.first.step, budget=12)
    assert len(small.steps) <= result.first.step + 1
    assert any(v.code == "ROOT_MISMATCH" for v in Simulation(small).run().violations)
