"""The daily reconciliation (SPEC §10, §15): the simulator's books against our money facts, cycle
states and entitlements. It reports; it never changes a cycle."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from dunning.jobs.framework import job_run
from dunning.jobs.reconciliation import DEFAULT_EVENT_PREFIXES
from dunning.models import (
    Alert,
    AlertKind,
    DunningCycle,
    FactKind,
    MonetaryFact,
    ProviderReceipt,
    ReconciliationReport,
    TransitionReceipt,
)
from subscriptions.models import Subscription

T0 = datetime(2030, 3, 10, 12, 0, tzinfo=UTC)
LATER = T0 + timedelta(minutes=10)  # past the 300 s allowed for deliveries in flight


@pytest.fixture
def clock():
    with time_machine.travel(T0, tick=True) as traveller:
        yield traveller


def reconcile(now=LATER):
    record = job_run("reconciliation", now=now)
    return record, ReconciliationReport.objects.get(run_for=now)


def by_kind(report):
    found = defaultdict(list)
    for entry in report.discrepancies:
        found[entry["kind"]].append(entry)
    return found


def subscribe(sim, email, *, card="ok"):
    customer = sim.create_customer(email, card="ok")
    sub_id = sim.create_subscription(customer, "price_monthly_pro", amount=4900)
    if card != "ok":
        sim.set_card(customer, card)
    return customer, sub_id


def failing_renewal(sim, email):
    customer, sub_id = subscribe(sim, email, card="insufficient_funds")
    invoice_id = sim.create_renewal_invoice(sub_id)
    sim.provider_attempt(invoice_id)
    return customer, sub_id, invoice_id


def test_consistent_books_reconcile_without_discrepancies(sim, clock):
    _, _, recovered = failing_renewal(sim, "recovered@example.com")
    sim.customer_pays(recovered, update_card=True)
    _, grace_sub, in_grace = failing_renewal(sim, "grace@example.com")
    sim.deliver_all()
    assert DunningCycle.objects.get(invoice__provider_invoice_id=recovered).state == "RECOVERED"
    assert Subscription.objects.get(provider_subscription_id=grace_sub).entitlement_profile == \
        "READ_EXPORT_NO_NEW_JOBS"

    record, report = reconcile()
    assert report.discrepancies == [], report.discrepancies
    assert record.status == "OK" and record.errors == 0
    totals = report.totals
    assert totals["discrepancies"] == 0 and totals["by_kind"] == {}
    assert totals["invoices_examined"] == 4 and totals["invoices_paid_at_provider"] == 3
    assert totals["subscriptions_examined"] == 2
    assert totals["events_checked"] > 10 and totals["events_missing"] == 0
    assert (report.window_start, report.window_end) == (LATER - timedelta(hours=24), LATER)
    assert not Alert.objects.filter(kind=AlertKind.RECONCILIATION_MISMATCH).exists()


def test_payment_whose_webhooks_were_lost_is_reported_and_alerted_without_changing_the_cycle(sim, clock):
    _, sub_id, invoice_id = failing_renewal(sim, "lost@example.com")
    sim.deliver_all()
    cycle = DunningCycle.objects.get(invoice__provider_invoice_id=invoice_id)
    assert cycle.state == "RETRY_SCHEDULED"
    sim.customer_pays(invoice_id, update_card=True)  # ...and none of its webhooks ever arrive
    lost = {e["id"] for e in sim.pending_events() if e["type"].startswith(DEFAULT_EVENT_PREFIXES)}
    assert any(sim.events_of_type("invoice.paid")) and lost
    transitions = TransitionReceipt.objects.count()

    record, report = reconcile()
    found = by_kind(report)
    (no_fact,) = found["PROVIDER_PAID_NO_LOCAL_FACT"]
    assert no_fact["provider_invoice_id"] == invoice_id and no_fact["provider_subscription_id"] == sub_id
    assert no_fact["provider_status"] == "paid" and no_fact["local_status"] == "open"
    assert "PAYMENT_SUCCEEDED" in no_fact["detail"]
    (cycle_open,) = found["PAID_BUT_CYCLE_OPEN"]
    assert cycle_open["cycle"] == str(cycle.cycle_id) and cycle_open["cycle_state"] == "RETRY_SCHEDULED"
    assert {d["event_id"] for d in found["EVENT_MISSING_FROM_INBOX"]} == lost
    assert "never reached our inbox" in found["EVENT_MISSING_FROM_INBOX"][0]["detail"]
    assert set(found) == {"PROVIDER_PAID_NO_LOCAL_FACT", "PAID_BUT_CYCLE_OPEN", "EVENT_MISSING_FROM_INBOX"}
    assert report.totals["discrepancies"] == 2 + len(lost)
    assert report.totals["by_kind"]["EVENT_MISSING_FROM_INBOX"] == len(lost)
    receipt = ProviderReceipt.objects.get(pk=no_fact["receipt"])  # the fresh fetch it cites
    assert (receipt.object_id, receipt.status) == (invoice_id, "paid")

    (alert,) = Alert.objects.filter(kind=AlertKind.RECONCILIATION_MISMATCH)
    assert alert.figures["report"] == report.pk and alert.resolved_at is None
    assert f"report {report.pk}" in alert.detail and "PROVIDER_PAID_NO_LOCAL_FACT" in alert.detail
    assert record.status == "OK" and record.errors == 0

    cycle.refresh_from_db()
    assert cycle.state == "RETRY_SCHEDULED", "reconciliation only reports"
    assert TransitionReceipt.objects.count() == transitions
    assert not MonetaryFact.objects.filter(invoice=cycle.invoice, kind=FactKind.PAYMENT_SUCCEEDED).exists()


def test_a_provider_fetch_failure_is_counted_and_the_run_goes_on(sim, clock):
    failing_renewal(sim, "first@example.com")
    sim.deliver_all()
    _, _, last = failing_renewal(sim, "last@example.com")
    sim.deliver_all()
    sim.customer_pays(last, update_card=True)  # lost webhooks, on the invoice fetched last
    sim.faults.error_500("GET /v1/invoices/*", count=1)  # the first invoice fetch fails

    record, report = reconcile()
    assert record.status == "PARTIAL" and record.errors == 1
    found = by_kind(report)
    (failed,) = found["FETCH_FAILED"]
    assert failed["provider_invoice_id"] and "not reconciled" in failed["detail"]
    assert failed["provider_invoice_id"] != last
    assert [d["provider_invoice_id"] for d in found["PROVIDER_PAID_NO_LOCAL_FACT"]] == [last]
    assert report.totals["fetch_failures"] == 1 and report.totals["invoices_examined"] == 4
    assert Alert.objects.filter(kind=AlertKind.RECONCILIATION_MISMATCH).count() == 1


def test_corrupted_root_and_entitlement_are_reported(sim, clock):
    _, healthy = subscribe(sim, "root@example.com")
    _, grace_sub, _ = failing_renewal(sim, "profile@example.com")
    sim.deliver_all()
    Subscription.objects.filter(provider_subscription_id=healthy).update(outstanding_cycle_root="0" * 64)
    Subscription.objects.filter(provider_subscription_id=grace_sub).update(entitlement_profile="FULL")

    _, report = reconcile()
    found = by_kind(report)
    (root,) = found["ROOT_MISMATCH"]
    assert root["provider_subscription_id"] == healthy and root["stored_root"] == "0" * 64
    assert root["recomputed_root"] != "0" * 64
    (entitlement,) = found["ENTITLEMENT_MISMATCH"]
    assert entitlement["provider_subscription_id"] == grace_sub
    assert (entitlement["stored_profile"], entitlement["recomputed_profile"]) == ("FULL", "READ_EXPORT_NO_NEW_JOBS")
    (snapshot,) = found["SNAPSHOT_MISMATCH"]
    assert snapshot["provider_subscription_id"] == grace_sub
    assert snapshot["snapshot_profile"] == "READ_EXPORT_NO_NEW_JOBS"
    assert set(found) == {"ROOT_MISMATCH", "ENTITLEMENT_MISMATCH", "SNAPSHOT_MISMATCH"}


def test_window_catches_up_after_a_missed_day_within_the_cap(sim, clock):
    _, first = reconcile(LATER)
    assert (first.window_start, first.window_end) == (LATER - timedelta(hours=24), LATER)

    three_days_later = LATER + timedelta(days=3)
    _, caught_up = reconcile(three_days_later)
    assert caught_up.window_start == first.window_end, "two missed days are reconciled, not skipped"

    rerun = three_days_later + timedelta(hours=1)
    _, same_day = reconcile(rerun)
    assert same_day.window_start == rerun - timedelta(hours=24), "a rerun still covers a full day"

    much_later = rerun + timedelta(days=30)
    record, capped = reconcile(much_later)
    assert capped.window_start == much_later - timedelta(days=7)
    assert capped.totals["unreconciled_gap"] == [rerun.isoformat(), (much_later - timedelta(days=7)).isoformat()]
    assert "past the catch-up cap" in record.detail
    stored = ReconciliationReport.objects.order_by("window_end")
    assert [r.window_end for r in stored] == [LATER, three_days_later, rerun, much_later]
    assert str(capped).startswith("reconciliation ")
