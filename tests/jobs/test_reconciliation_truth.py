"""Reconciliation tells the truth (issue 15, item 7): it reports a difference only where the
provider's books and ours really differ — never on the provider's stale copy of an invoice,
never on a change still in flight — and it finds the money differences (refunds, dispute
funds) and the lost webhooks of the last minutes before a run. The simulation's check compares
each stored report with the simulator's ledger both ways."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from dunning.jobs.framework import job_run
from dunning.models import DunningCycle, ReconciliationReport
from subscriptions.models import Subscription
from tests.verification.simulation import Schedule, Simulation
from tests.verification.simulation.reconciliation_check import (
    FALSE_FINDING,
    MIRROR_WENT_BACK,
    MISSED_DIFFERENCE,
    check_mirrors,
    check_reports,
    newest_report_pk,
)

T0 = datetime(2030, 3, 10, 12, 0, tzinfo=UTC)
LATER = T0 + timedelta(minutes=10)


@pytest.fixture
def clock():
    with time_machine.travel(T0, tick=True) as traveller:
        yield traveller


def reconcile(now=LATER):
    job_run("reconciliation", now=now)
    return ReconciliationReport.objects.get(run_for=now)


def by_kind(report):
    found = defaultdict(list)
    for entry in report.discrepancies:
        found[entry["kind"]].append(entry)
    return found


def paid_renewal(sim, email="books@example.com"):
    customer = sim.create_customer(email, card="ok")
    sub_id = sim.create_subscription(customer, "price_monthly_pro", amount=4900)
    invoice_id = sim.create_renewal_invoice(sub_id)
    sim.provider_attempt(invoice_id)
    sim.deliver_all()
    return invoice_id, sim.successful_charges(invoice_id)[0]["id"]


def failing_renewal(sim, email="late@example.com"):
    customer = sim.create_customer(email, card="ok")
    sub_id = sim.create_subscription(customer, "price_monthly_pro", amount=4900)
    sim.set_card(customer, "insufficient_funds")
    invoice_id = sim.create_renewal_invoice(sub_id)
    sim.provider_attempt(invoice_id)
    sim.deliver_all()
    return invoice_id


def at(ts: int) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


# ---- no false alarms


def test_the_providers_stale_copy_of_a_paid_invoice_is_read_again_not_reported(sim, clock):
    invoice_id, _ = paid_renewal(sim)
    sim.faults.stale_read(invoice_id, 1)  # the reconciliation's read answers from before the payment

    report = reconcile()
    assert report.discrepancies == [], report.discrepancies
    assert report.totals["stale_reads"] == 1 and report.totals["read_stale"] == []


def test_an_invoice_the_provider_keeps_answering_stale_for_is_not_reconciled_rather_than_misreported(sim, clock):
    invoice_id, _ = paid_renewal(sim)
    sim.faults.stale_read(invoice_id, 50)

    record = job_run("reconciliation", now=LATER)
    report = ReconciliationReport.objects.get(run_for=LATER)
    assert report.discrepancies == [], report.discrepancies
    assert report.totals["read_stale"] == [invoice_id] and report.totals["invoices_read_stale"] == 1
    assert "old copy" in record.detail


def test_a_change_still_in_flight_is_left_to_the_next_run(sim, clock):
    invoice_id = failing_renewal(sim)
    sim.customer_pays(invoice_id, update_card=True)  # its webhooks are not delivered (yet)
    paid_at = at(sim.get(invoice_id)["status_transitions"]["paid_at"])

    early = reconcile(paid_at + timedelta(seconds=30))
    assert early.discrepancies == [], "30 s after the payment its webhooks are in flight, not lost"
    assert early.totals["invoices_settling"] >= 1

    late = reconcile(paid_at + timedelta(minutes=10))  # they never came
    found = by_kind(late)
    assert [d["provider_invoice_id"] for d in found["PROVIDER_PAID_NO_LOCAL_FACT"]] == [invoice_id]
    assert [d["provider_invoice_id"] for d in found["PAID_BUT_CYCLE_OPEN"]] == [invoice_id]
    assert found["EVENT_MISSING_FROM_INBOX"]


def test_a_webhook_lost_in_the_minutes_before_a_run_is_found_by_the_next_run(sim, clock):
    invoice_id = failing_renewal(sim)
    sim.customer_pays(invoice_id, update_card=True)  # lost for good
    lost = {e["id"] for e in sim.pending_events() if e["type"].startswith(("invoice.", "charge.", "payment_intent."))}
    paid_at = at(sim.get(invoice_id)["status_transitions"]["paid_at"])

    first = reconcile(paid_at + timedelta(seconds=60))
    assert not by_kind(first)["EVENT_MISSING_FROM_INBOX"], "in flight at the first run"
    next_day = reconcile(paid_at + timedelta(seconds=60, days=1))
    assert next_day.window_start == paid_at + timedelta(seconds=60)  # after the event was created...
    assert {d["event_id"] for d in by_kind(next_day)["EVENT_MISSING_FROM_INBOX"]} >= lost  # ...still counted


def test_a_contract_date_that_just_passed_is_left_to_the_contract_deadlines_job(sim, time_machine):
    """Seed 5 (3,000 steps): a pause's resume time had passed seconds before a run; the
    contract_deadlines job had not had its minute yet, and ENTITLEMENT_MISMATCH was raised."""
    time_machine.move_to("2030-03-10T12:00:00Z", tick=True)
    customer = sim.create_customer("pause@example.com", card="ok")
    sub_id = sim.create_subscription(customer, "price_monthly_pro", amount=4900)
    sim.deliver_all()
    resumes_at = datetime.now(UTC) + timedelta(minutes=5)
    sim.pause_subscription(sub_id, resumes_at=resumes_at)
    sim.deliver_all()
    assert Subscription.objects.get(provider_subscription_id=sub_id).entitlement_profile == "READ_EXPORT_NO_NEW_JOBS"

    time_machine.move_to(resumes_at + timedelta(seconds=30), tick=True)
    assert "ENTITLEMENT_MISMATCH" not in by_kind(reconcile(datetime.now(UTC)))
    time_machine.move_to(resumes_at + timedelta(minutes=10), tick=True)  # and the job never ran
    (mismatch,) = by_kind(reconcile(datetime.now(UTC)))["ENTITLEMENT_MISMATCH"]
    assert (mismatch["stored_profile"], mismatch["recomputed_profile"]) == ("READ_EXPORT_NO_NEW_JOBS", "FULL")


# ---- money: paid − refunded and dispute funds, against the provider's charges and disputes


def test_a_refund_whose_webhook_was_lost_is_found_on_a_settled_invoice(sim, clock):
    invoice_id, charge = paid_renewal(sim)
    sim.refund(charge, 1000)
    sim.deliver_all()
    sim.refund(charge, 1500)  # its webhook never arrives
    assert DunningCycle.objects.get(invoice__provider_invoice_id=invoice_id).state == "RECOVERED"

    report = reconcile()
    (net,) = by_kind(report)["NET_PAID_DIFFERS"]
    assert net["provider_invoice_id"] == invoice_id
    assert (net["provider_paid"], net["provider_refunded"]) == (4900, 2500)
    assert (net["local_paid"], net["local_refunded"]) == (4900, 1000)
    assert set(by_kind(report)) == {"NET_PAID_DIFFERS", "EVENT_MISSING_FROM_INBOX"}

    sim.deliver_all()  # late, but it came: the books add up again
    assert reconcile(LATER + timedelta(hours=1)).discrepancies == []


def test_a_dispute_we_never_heard_of_and_funds_reinstated_without_our_knowing_are_found(sim, clock):
    invoice_id, charge = paid_renewal(sim)
    dispute = sim.open_dispute(charge)  # its webhooks are lost

    (unrecorded,) = by_kind(reconcile())["DISPUTE_NOT_RECORDED"]
    assert (unrecorded["provider_invoice_id"], unrecorded["charge"]) == (invoice_id, charge)

    sim.deliver_all()
    assert reconcile(LATER + timedelta(hours=1)).discrepancies == []
    sim.close_dispute(dispute, won=True)  # and these are lost
    (funds,) = by_kind(reconcile(LATER + timedelta(hours=2)))["DISPUTE_FUNDS_DIFFER"]
    assert (funds["provider_withdrawn"], funds["provider_reinstated"]) == (4900, 4900)
    assert (funds["local_withdrawn"], funds["local_reinstated"]) == (4900, 0)


# ---- the simulation's check: every finding real, every real difference found


@pytest.fixture
def world(db):
    return Simulation(Schedule(seed=0, plans=("standard",))).session()


def test_the_check_finds_reports_true_when_they_name_the_real_differences(world):
    with world as w:
        since = newest_report_pk()
        invoice_id = w.failed_renewal()
        w.sim.set_card(w.customers[0], "ok")
        w.sim.customer_pays(invoice_id)  # never delivered before the run
        w.tick(3600)
        w.run_jobs(only=("reconciliation",))
        report = ReconciliationReport.objects.get(pk=newest_report_pk())
        assert {"PROVIDER_PAID_NO_LOCAL_FACT", "PAID_BUT_CYCLE_OPEN"} <= set(by_kind(report))
        assert check_reports(w, since=since) == []
        assert check_mirrors(w) == []


def test_the_check_reports_a_finding_the_ledger_does_not_bear_out_and_a_difference_left_out(world):
    with world as w:
        since = newest_report_pk()
        invoice_id = w.failed_renewal()
        w.tick(3600)
        now = w.now()
        consistent = ReconciliationReport.objects.create(
            run_for=now, window_start=now - timedelta(days=1), window_end=now, created_at=now, totals={},
            discrepancies=[{"kind": "PROVIDER_PAID_NO_LOCAL_FACT", "provider_invoice_id": invoice_id,
                            "detail": "made up"}])
        ((code, detail),) = check_reports(w, since=since)
        assert code == FALSE_FINDING and invoice_id in detail and f"report {consistent.pk}" in detail

        w.sim.set_card(w.customers[0], "ok")
        w.sim.customer_pays(invoice_id)  # not delivered
        w.tick(3600)
        now = w.now()
        ReconciliationReport.objects.create(run_for=now, window_start=now - timedelta(days=1), window_end=now,
                                            created_at=now, totals={}, discrepancies=[])
        missed = check_reports(w, since=consistent.pk)
        assert {code for code, _ in missed} == {MISSED_DIFFERENCE}
        assert any("PROVIDER_PAID_NO_LOCAL_FACT" in detail and invoice_id in detail for _, detail in missed)
        assert any("EVENT_MISSING_FROM_INBOX" in detail for _, detail in missed)


def test_the_check_sees_a_mirror_that_went_back_to_an_earlier_status(world):
    """What the auditor missed on seed 3: a stale read taken for the truth moved a paid invoice's
    mirror back to open. The acceptance now refuses such a read (STALE_INVOICE_READ), so the fault
    is injected here as a write past it, which is what a future bug would look like."""
    from dunning.acceptance.inputs import Cause, Evidence, Expect, InvoiceUpdate
    from dunning.acceptance.transitions import cycle_accept_transition

    with world as w:
        invoice_id = w.failed_renewal()
        w.sim.set_card(w.customers[0], "ok")
        w.sim.customer_pays(invoice_id)
        w.deliver()
        cycle = w.cycle(invoice_id)
        assert cycle.invoice.status == "paid" and check_mirrors(w) == []
        old_copy = InvoiceUpdate(status="open", amount_due=cycle.invoice.amount_due, amount_paid=0,
                                 attempt_count=1, next_payment_attempt=None)
        refused = cycle_accept_transition(cycle_pk=cycle.pk, edge="record_evidence", expect=Expect.from_cycle(cycle),
                                          cause=Cause.system("stale read"), evidence=Evidence(invoice=old_copy),
                                          now=w.now())
        assert not refused.accepted and refused.reason == "STALE_INVOICE_READ"
        assert check_mirrors(w) == []
        mirror = cycle.invoice
        mirror.status, mirror.amount_paid = "open", 0
        mirror.save(update_fields=["status", "amount_paid"])  # the fault: a write past the acceptance
        ((code, detail),) = check_mirrors(w)
        assert code == MIRROR_WENT_BACK and invoice_id in detail and "open after it held paid" in detail
        w.audit()
        assert MIRROR_WENT_BACK in {v.code for v in w.violations}, "the auditor runs the check after every step"


def test_the_auditor_judges_each_new_report_against_the_ledger(world):
    with world as w:
        invoice_id = w.failed_renewal()
        w.tick(3600)
        w.audit()
        assert not w.violations
        now = w.now()
        ReconciliationReport.objects.create(
            run_for=now, window_start=now - timedelta(days=1), window_end=now, created_at=now, totals={},
            discrepancies=[{"kind": "PROVIDER_PAID_NO_LOCAL_FACT", "provider_invoice_id": invoice_id,
                            "detail": "made up"}])
        w.audit()
        assert FALSE_FINDING in {v.code for v in w.violations}
