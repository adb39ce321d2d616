"""The auditor catches deliberately broken builds. Each test monkeypatches one breakage into
the product for its duration and asserts the auditor names it."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from dunning.acceptance import edges
from dunning.acceptance import settlement as recompute
from tests.verification.simulation import Simulation, generate
from tests.verification.simulation.shrink import shrink


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

    def keep_old_root(subscription, changed_cycle, now=None, **read):
        _, decision = real(subscription, changed_cycle, now, **read)
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
    from dunning.acceptance.inputs import Evidence
    from dunning.jobs import cycle_jobs

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
    from dunning.acceptance.aggregate import Decision

    real = recompute.compute_aggregate
    always_full = Decision(profile="FULL", reason="broken build", blocking_count=0)
    monkeypatch.setattr(recompute, "compute_aggregate",
                        lambda sub, cycle, now=None, **read: (real(sub, cycle, now, **read)[0], always_full))
    w = _two_invoices_one_paid(world)
    assert "FULL_WHILE_BLOCKING" in _codes(w)


def test_grace_held_by_a_scheduled_provider_retry_is_caught(world, monkeypatch):
    """The build before grace became a deadline: only GRACE_ACTIVE expires, so a cycle waiting on
    a provider retry scheduled after the grace end keeps the grace profile until retries end."""
    from dunning.jobs import cycle_jobs

    monkeypatch.setattr(cycle_jobs, "GRACE_DEADLINE_STATES", frozenset({"GRACE_ACTIVE"}))
    with world("standard") as w:  # provider retries on days 3, 8 and 15; grace ends on day 7
        invoice = w.failed_renewal(0, "insufficient_funds")
        w.advance(7.5 * 86400)
        assert w.cycle(invoice).state == "RETRY_SCHEDULED"
        w.audit()
    assert "GRACE_OVERRUN" in _codes(w)


def test_full_access_on_an_ended_contract_is_caught(world, monkeypatch):
    monkeypatch.setattr(recompute, "with_contract", lambda debt, subscription, spec, now: debt)
    with world("standard") as w:
        w.sim.cancel_subscription(w.subscriptions[0])
        w.deliver()
        assert w.subscription().entitlement_profile == "FULL"
        w.audit()
    assert "ENDED_CONTRACT_FULL" in _codes(w)


def test_period_end_not_applied_is_caught(world, monkeypatch):
    """Access recomputed with the contract as of its last fetch instead of `now`: the period end of
    a contract set to cancel then is never applied while the provider stays silent."""
    real = recompute.with_contract
    monkeypatch.setattr(recompute, "with_contract",
                        lambda debt, subscription, spec, now: real(debt, subscription, spec,
                                                                   subscription.contract_fetched_at or now))
    with world("standard") as w:
        sub_id = w.subscriptions[0]
        w.sim.cancel_subscription(sub_id, at_period_end=True)
        w.deliver()
        w.sim.faults.error_500("GET /v1/subscriptions/*", apply=False, count=10_000)  # no fresh read …
        w.sim.faults.delay_deliveries(30 * 86400)  # … and the provider's deletion event is held back
        w.advance(w.sim.get(sub_id)["current_period_end"] - w.now().timestamp() + 300)
        assert w.subscription().entitlement_profile == "FULL"
        w.audit()
    assert "ENDED_CONTRACT_FULL" in _codes(w)


def _staff_cancellation(w):
    from dunning.acceptance.inputs import Cause, Expect
    from dunning.acceptance.transitions import cycle_accept_transition

    invoice = w.failed_renewal(0, "stolen_card")
    w.advance(8 * 86400)
    cycle = w.cycle(invoice)
    cycle_accept_transition(cycle_pk=cycle.pk, edge="request_cancellation", expect=Expect.from_cycle(cycle),
                            cause=Cause.staff(w.lead, reason="close the account", ticket="SIM-1"), now=w.now())
    w.run_jobs(only=("cancellation",))
    assert w.cycle(invoice).state == "CANCELED"


def test_cancellation_neither_confirmed_nor_alerted_is_caught(world, monkeypatch):
    from dunning.jobs import alerts

    monkeypatch.setattr(alerts, "check_cancel_unconfirmed", lambda run: None)
    with world("standard") as w:
        w.sim.faults.error_500("DELETE /v1/subscriptions/*", apply=False, count=10_000)
        _staff_cancellation(w)
        w.advance(2 * 3600)
        w.audit()
    assert "CANCEL_NOT_CONFIRMED" in _codes(w)


def test_time_guard_passed_ahead_of_the_trusted_clock_is_caught(world, monkeypatch):
    from dunning.acceptance import subscription as subscription_acceptance
    from dunning.acceptance import transitions as acceptance

    for module in (acceptance, subscription_acceptance):
        monkeypatch.setattr(module, "now_is_not_ahead", lambda now, policy_clock, database_clock=None: (True, now))
    with world("standard") as w:
        invoice = w.failed_renewal(0, "stolen_card")
        w.run_jobs_ahead(timedelta(days=8))
        assert w.cycle(invoice).state != "GRACE_ACTIVE", "grace expired a week early"
        w.audit()
    assert {"TIME_GUARD_AHEAD_OF_CLOCK", "FUTURE_NOW_CHANGED_STATE"} <= _codes(w)


@pytest.mark.django_db
def test_random_schedule_catches_a_broken_build_and_shrinks_it(monkeypatch):
    real = recompute.compute_aggregate
    monkeypatch.setattr(recompute, "compute_aggregate",
                        lambda sub, cycle, now=None, **read: (sub.outstanding_cycle_root,
                                                              real(sub, cycle, now, **read)[1]))
    schedule = generate(7, 120)
    result = Simulation(schedule).run()
    assert result.first is not None and result.first.code == "ROOT_MISMATCH"
    small = shrink(schedule, "ROOT_MISMATCH", failing_step=result.first.step, budget=12)
    assert len(small.steps) <= result.first.step + 1
    assert any(v.code == "ROOT_MISMATCH" for v in Simulation(small).run().violations)
