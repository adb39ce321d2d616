"""Grace expiry, restriction and cancellation on the clock (SPEC §5, §10): only with a fresh
receipt, payment wins at the boundary, fetch failures restrict nothing, outages catch up."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from dunning.acceptance.guards import fresh_receipt_max_age
from dunning.jobs.framework import job_run
from dunning.models import JobRun, MonetaryFact
from dunning.models import TransitionReceipt as Receipt
from tests.support.scenarios import cycle_of, failed_renewal, pay_without_webhook


@pytest.fixture
def in_grace(sim, time_machine):
    time_machine.move_to("2026-12-01T09:00:00Z", tick=True)
    customer, invoice_id, cycle = failed_renewal(sim)
    assert cycle.state == "GRACE_ACTIVE" and cycle.customer_action_required
    return customer, invoice_id, cycle


def edges(cycle, accepted=True):
    return list(Receipt.objects.filter(cycle=cycle, accepted=accepted).order_by("pk").values_list("edge", flat=True))


def test_grace_sweep_before_expiry_changes_nothing(in_grace, time_machine):
    _, invoice_id, cycle = in_grace
    time_machine.move_to(cycle.grace_expires_at - timedelta(minutes=1), tick=False)
    run = job_run("grace_expiry")
    assert (run.examined, run.changed, run.status) == (0, 0, "OK")
    assert cycle_of(invoice_id).state == "GRACE_ACTIVE"


def test_expired_grace_restricts_with_a_fresh_unpaid_receipt(in_grace, time_machine, sim):
    _, invoice_id, cycle = in_grace
    time_machine.move_to(cycle.grace_expires_at + timedelta(minutes=1), tick=True)
    run = job_run("grace_expiry")
    cycle = cycle_of(invoice_id)
    assert cycle.state == "RESTRICTED", run.detail
    assert cycle.subscription.entitlement_profile == "SUSPENDED"
    restriction = Receipt.objects.get(cycle=cycle, edge="begin_restriction", accepted=True)
    evidence = restriction.evidence_receipt
    assert evidence.status == "open" and evidence.object_id == invoice_id
    assert abs(restriction.trusted_time - evidence.fetched_at) <= fresh_receipt_max_age()
    assert (run.changed, run.errors, run.status) == (3, 0, "OK")
    assert JobRun.objects.filter(job="grace_expiry", status="OK").count() == 1


def test_expiry_and_restriction_are_one_acceptance_after_the_fetch(in_grace, time_machine, sim):
    """The sweep fetches first and, on an unpaid receipt, takes GRACE_ACTIVE → GRACE_EXPIRED →
    RESTRICTING → RESTRICTED in one transaction: one lock of the rows, three receipts."""
    _, invoice_id, cycle = in_grace
    time_machine.move_to(cycle.grace_expires_at + timedelta(minutes=1), tick=True)
    with CaptureQueriesContext(connection) as queries:
        run = job_run("grace_expiry")
    cycle = cycle_of(invoice_id)
    assert cycle.state == "RESTRICTED" and (run.changed, run.refused, run.errors) == (3, 0, 0), run.detail
    assert edges(cycle)[-3:] == ["expire_grace", "begin_restriction", "complete_restriction"]
    assert sum("FOR UPDATE OF" in q["sql"] for q in queries.captured_queries) == 1


def test_a_paid_receipt_still_ends_grace_then_recovers(in_grace, time_machine, sim):
    """A receipt that moves the cycle is applied as before: grace ends, then the evidence recovers it."""
    customer, invoice_id, cycle = in_grace
    time_machine.move_to(cycle.grace_expires_at + timedelta(minutes=1), tick=True)
    pay_without_webhook(sim, customer, invoice_id)
    run = job_run("grace_expiry")
    cycle = cycle_of(invoice_id)
    assert cycle.state == "RECOVERED" and run.refused == 0, run.detail
    assert edges(cycle)[-2:] == ["expire_grace", "recover"] and edges(cycle, accepted=False) == []


def test_payment_found_by_the_fresh_fetch_recovers_instead(in_grace, time_machine, sim):
    customer, invoice_id, cycle = in_grace
    time_machine.move_to(cycle.grace_expires_at - timedelta(hours=1), tick=True)
    pay_without_webhook(sim, customer, invoice_id)
    time_machine.move_to(cycle.grace_expires_at + timedelta(minutes=5), tick=True)
    job_run("grace_expiry")
    cycle = cycle_of(invoice_id)
    assert cycle.state == "RECOVERED"
    assert cycle.subscription.entitlement_profile == "FULL"
    assert "begin_restriction" not in edges(cycle)
    assert len(sim.successful_charges(invoice_id)) == 1


def test_payment_at_the_exact_deadline_wins_over_restriction(in_grace, time_machine, sim):
    customer, invoice_id, cycle = in_grace
    deadline = cycle.grace_expires_at
    time_machine.move_to(deadline, tick=False)
    pay_without_webhook(sim, customer, invoice_id)
    job_run("grace_expiry", now=deadline)
    cycle = cycle_of(invoice_id)
    assert cycle.state == "RECOVERED" and cycle.subscription.entitlement_profile == "FULL"
    assert "begin_restriction" not in edges(cycle) and "begin_restriction" not in edges(cycle, accepted=False)


def test_payment_webhook_at_the_deadline_then_sweep_does_nothing(in_grace, time_machine, sim):
    customer, invoice_id, cycle = in_grace
    time_machine.move_to(cycle.grace_expires_at, tick=False)
    sim.set_card(customer, "ok")
    sim.customer_pays(invoice_id)
    sim.deliver_all()
    run = job_run("grace_expiry")
    assert cycle_of(invoice_id).state == "RECOVERED"
    assert run.examined == 0


def test_failed_fetch_restricts_nothing_counts_and_is_retried(in_grace, time_machine, sim):
    _, invoice_id, cycle = in_grace
    time_machine.move_to(cycle.grace_expires_at + timedelta(minutes=1), tick=True)
    sim.faults.error_500("GET /v1/invoices/*", count=10)
    run = job_run("grace_expiry")
    cycle = cycle_of(invoice_id)
    assert cycle.state == "GRACE_EXPIRED", "expiry itself needs no provider"
    assert cycle.subscription.entitlement_profile == "READ_EXPORT_NO_NEW_JOBS", "still the grace profile"
    assert (run.errors, run.status) == (1, "PARTIAL") and "fetch failed" in run.detail
    sim.faults.clear()
    with CaptureQueriesContext(connection) as queries:
        retry = job_run("restriction")
    assert cycle_of(invoice_id).state == "RESTRICTED", retry.detail
    assert sum("FOR UPDATE OF" in q["sql"] for q in queries.captured_queries) == 1, "begin + complete: one acceptance"


def test_a_now_ahead_of_the_trusted_clock_takes_no_step(in_grace, sim, time_machine):
    """`run_jobs --now` days past the clock: no expiry, no restriction, no cancellation, and
    so nothing premature left for the next normal run to finish (SPEC §5, issue: one clock)."""
    _, invoice_id, cycle = in_grace
    generation = cycle.subscription.entitlement_generation
    run = job_run("grace_expiry", now=cycle.grace_expires_at + timedelta(days=3))
    cycle = cycle_of(invoice_id)
    assert cycle.state == "GRACE_ACTIVE"
    refused = Receipt.objects.get(cycle=cycle, edge="expire_grace", accepted=False)
    assert refused.rejection_reason == "NOW_AFTER_TRUSTED_CLOCK" and run.refused == 1
    assert not Receipt.objects.filter(cycle=cycle, edge="begin_restriction").exists()
    job_run("grace_expiry")  # the next normal run, still before the deadline
    cycle = cycle_of(invoice_id)
    assert cycle.state == "GRACE_ACTIVE" and cycle.subscription.entitlement_generation == generation
    time_machine.move_to(cycle.grace_expires_at + timedelta(minutes=1), tick=True)
    job_run("grace_expiry")
    assert cycle_of(invoice_id).state == "RESTRICTED", "the real deadline still restricts"


def test_three_day_scheduler_outage_is_caught_up_in_order(sim, time_machine, staff):
    from django.core.management import call_command

    from tests.support.builders import accept

    start = "2026-12-01T09:00:00Z"
    time_machine.move_to(start, tick=True)
    _, unpaid_id, unpaid = failed_renewal(sim)
    payer, paid_id, paid = failed_renewal(sim)
    _, excepted_id, excepted = failed_renewal(sim)
    from dunning.acceptance.inputs import Cause

    grant = accept(excepted, "grant_exception", cause=Cause.staff(staff, reason="outage", ticket="T-1"),
                   expires_at=excepted.grace_expires_at + timedelta(days=1))
    assert grant.accepted, grant
    # The scheduler stops; during the outage one customer pays and the webhook is lost.
    time_machine.move_to(unpaid.grace_expires_at + timedelta(days=1), tick=True)
    pay_without_webhook(sim, payer, paid_id)
    time_machine.move_to(unpaid.grace_expires_at + timedelta(days=3), tick=True)
    call_command("run_jobs")
    assert cycle_of(unpaid_id).state == "RESTRICTED"
    assert cycle_of(paid_id).state == "RECOVERED" and cycle_of(paid_id).subscription.entitlement_profile == "FULL"
    excepted = cycle_of(excepted_id)
    assert excepted.state == "RESTRICTED", "exception expired, then grace expiry and a fresh unpaid receipt"
    order = edges(excepted)
    assert order.index("expire_exception") < order.index("expire_grace") < order.index("begin_restriction")
    for cycle in (cycle_of(unpaid_id), excepted):
        restriction = Receipt.objects.get(cycle=cycle, edge="begin_restriction", accepted=True)
        assert restriction.evidence_receipt.fetched_at >= restriction.trusted_time - fresh_receipt_max_age()
    assert not MonetaryFact.objects.filter(invoice__provider_invoice_id__in=[unpaid_id, excepted_id],
                                           kind="PAYMENT_SUCCEEDED").exists()


def test_cancellation_after_the_restricted_period_needs_a_fresh_receipt(in_grace, time_machine, sim):
    customer, invoice_id, cycle = in_grace
    time_machine.move_to(cycle.grace_expires_at + timedelta(minutes=1), tick=True)
    job_run("grace_expiry")
    restricted_at = cycle_of(invoice_id).restricted_at
    time_machine.move_to(restricted_at + timedelta(days=29), tick=True)
    assert job_run("cancellation").changed == 0
    assert cycle_of(invoice_id).state == "RESTRICTED"
    time_machine.move_to(restricted_at + timedelta(days=30, minutes=1), tick=True)
    sim.faults.error_500("GET /v1/invoices/*", count=10)
    failed = job_run("cancellation")
    assert failed.errors == 1 and cycle_of(invoice_id).state == "RESTRICTED"
    sim.faults.clear()
    with CaptureQueriesContext(connection) as queries:
        job_run("cancellation")
    cycle = cycle_of(invoice_id)
    assert cycle.state == "CANCELED" and cycle.subscription.entitlement_profile == "REVOKED"
    assert edges(cycle)[-2:] == ["request_cancellation", "cancel"]
    assert sum("FOR UPDATE OF" in q["sql"] for q in queries.captured_queries) == 1, "request + cancel: one acceptance"
    cancel = Receipt.objects.get(cycle=cycle, edge="cancel", accepted=True)
    assert cancel.evidence_receipt.status == "open"


def test_restricted_customer_who_paid_is_recovered_not_canceled(in_grace, time_machine, sim):
    customer, invoice_id, cycle = in_grace
    time_machine.move_to(cycle.grace_expires_at + timedelta(minutes=1), tick=True)
    job_run("grace_expiry")
    time_machine.move_to(cycle_of(invoice_id).restricted_at + timedelta(days=31), tick=True)
    pay_without_webhook(sim, customer, invoice_id)
    job_run("cancellation")
    cycle = cycle_of(invoice_id)
    assert cycle.state == "RECOVERED" and cycle.subscription.entitlement_profile == "FULL"
    assert "cancel" not in edges(cycle) and "request_cancellation" not in edges(cycle)


def test_exception_expiry_returns_to_the_suspended_state(in_grace, time_machine, staff):
    from dunning.acceptance.inputs import Cause
    from tests.support.builders import accept

    _, invoice_id, cycle = in_grace
    assert accept(cycle, "grant_exception", cause=Cause.staff(staff, reason="goodwill", ticket="T-9"),
                  expires_at=cycle.grace_started_at + timedelta(days=2)).accepted
    assert cycle_of(invoice_id).subscription.entitlement_profile == "FULL"
    time_machine.move_to(cycle.grace_started_at + timedelta(days=2) - timedelta(seconds=1), tick=False)
    assert job_run("exception_expiry").changed == 0
    time_machine.move_to(cycle.grace_started_at + timedelta(days=2), tick=False)
    assert job_run("exception_expiry").changed == 1
    cycle = cycle_of(invoice_id)
    assert cycle.state == "GRACE_ACTIVE" and cycle.subscription.entitlement_profile == "READ_EXPORT_NO_NEW_JOBS"


def test_a_long_sweep_whose_now_fell_behind_the_clock_still_restricts(in_grace, time_machine):
    """A 100k sweep runs for many minutes with the `now` it started with; receipts fetched late
    in the run are stamped by the clock. They are fresh, so restriction must not be refused."""
    _, invoice_id, cycle = in_grace
    started = cycle.grace_expires_at + timedelta(minutes=1)
    time_machine.move_to(started + timedelta(minutes=10), tick=True)  # the sweep has been running 10 min
    run = job_run("grace_expiry", now=started)
    assert cycle_of(invoice_id).state == "RESTRICTED", run.detail
    assert run.refused == 0


def test_a_payment_processed_while_the_sweep_fetches_leaves_no_refusal(in_grace, time_machine, sim, monkeypatch):
    """The customer pays, the sweep's fetch sees it, and the paid webhook recovers the cycle
    before the sweep acts: the sweep must act on the cycle as it is now (nothing left to do),
    not try a restriction on its earlier read and leave a refusal on a customer who paid."""
    from dunning.jobs import cycle_jobs

    customer, invoice_id, cycle = in_grace
    time_machine.move_to(cycle.grace_expires_at + timedelta(minutes=1), tick=True)
    fetch = cycle_jobs.invoice_fetch_fresh

    def fetch_then_the_webhook_lands(fetched_cycle):  # noqa: ANN001, ANN202
        sim.set_card(customer, "ok")
        sim.customer_pays(invoice_id)
        fetched = fetch(fetched_cycle)
        sim.deliver_all()
        return fetched

    monkeypatch.setattr(cycle_jobs, "invoice_fetch_fresh", fetch_then_the_webhook_lands)
    run = job_run("grace_expiry")
    cycle = cycle_of(invoice_id)
    assert cycle.state == "RECOVERED" and cycle.subscription.entitlement_profile == "FULL"
    assert edges(cycle, accepted=False) == [] and run.refused == 0, run.detail
