"""The alerts job (SPEC §10, §15) and the alert service: paid but not restored after 60 s, two
successful charges for one invoice, a failure-rate spike against the 7-day mean; one alert per
condition however often it is seen."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import connection

from dunning.actions.alerts import alert_raise, alert_resolve
from dunning.evidence.processing import event_process
from dunning.jobs.alerts import failure_rates
from dunning.jobs.framework import job_run
from dunning.models import (
    Alert,
    AlertKind,
    DunningCycle,
    EventOutcome,
    FactKind,
    MonetaryFact,
    PaymentAttempt,
    ProviderEvent,
)
from subscriptions.models import Subscription
from tests.support.builders import accept, fail_first_payment, make_subscription, open_cycle, paid_evidence, reload
from tests.support.threads import run_together

NOON = datetime(2030, 3, 10, 12, 0, tzinfo=UTC)


@pytest.fixture
def clock():
    with time_machine.travel(NOON, tick=True) as traveller:
        yield traveller


def run_alerts(now):
    record = job_run("alerts", now=now)
    assert record.status == "OK", record.detail
    return record


def alerts_of(kind):
    return list(Alert.objects.filter(kind=kind).order_by("pk"))


# --------------------------------------------------------------------------- the alert service


def test_raising_again_counts_occurrences_on_one_row(db):
    first = alert_raise(kind=AlertKind.DUPLICATE_CHARGE, dedupe_key="k:1", detail="d", figures={"n": 1}, now=NOON)
    again = alert_raise(kind=AlertKind.DUPLICATE_CHARGE, dedupe_key="k:1", detail="d2", figures={"n": 2},
                        now=NOON + timedelta(minutes=1))
    assert again.pk == first.pk
    assert (again.occurrences, again.last_seen_at, again.raised_at) == (2, NOON + timedelta(minutes=1), NOON)
    assert again.figures == {"n": 1}, "an episode keeps what was seen when it was raised"
    late = alert_raise(kind=AlertKind.DUPLICATE_CHARGE, dedupe_key="k:1", detail="d", figures={}, now=NOON)
    assert late.last_seen_at == NOON + timedelta(minutes=1), "a late sighting never moves last_seen_at back"
    assert Alert.objects.count() == 1


def test_a_resolved_alert_that_fires_again_opens_a_new_episode(db):
    first = alert_raise(kind=AlertKind.PAID_NOT_RESTORED, dedupe_key="paid_not_restored:in_1", detail="d",
                        figures={}, now=NOON)
    resolved = alert_resolve(first, by="agent", now=NOON + timedelta(minutes=5))
    assert (resolved.resolved_at, resolved.resolved_by) == (NOON + timedelta(minutes=5), "agent")
    again = alert_resolve(resolved, by="someone else", now=NOON + timedelta(hours=1))
    assert again.resolved_by == "agent", "resolving twice keeps the first resolution"
    second = alert_raise(kind=AlertKind.PAID_NOT_RESTORED, dedupe_key="paid_not_restored:in_1", detail="d",
                         figures={}, now=NOON + timedelta(hours=2))
    assert second.pk != first.pk and second.dedupe_key == "paid_not_restored:in_1#2"
    assert second.occurrences == 1 and second.resolved_at is None
    first.refresh_from_db()
    assert first.resolved_by == "agent" and first.occurrences == 1
    third = alert_raise(kind=AlertKind.PAID_NOT_RESTORED, dedupe_key="paid_not_restored:in_1", detail="d",
                        figures={}, now=NOON + timedelta(hours=3))
    assert third.pk == second.pk and third.occurrences == 2


def test_a_worker_that_read_before_another_inserted_bumps_instead_of_duplicating(db, monkeypatch):
    """Deterministic form of the race: our read saw nothing, then another worker's insert landed."""
    from dunning.actions import alerts as service

    other = alert_raise(kind=AlertKind.DUPLICATE_CHARGE, dedupe_key="k:race", detail="d", figures={}, now=NOON)
    real = service._episodes
    calls = {"n": 0}

    def stale_first_read(key):
        calls["n"] += 1
        return real(key).none() if calls["n"] == 1 else real(key)

    monkeypatch.setattr(service, "_episodes", stale_first_read)
    mine = alert_raise(kind=AlertKind.DUPLICATE_CHARGE, dedupe_key="k:race", detail="d", figures={}, now=NOON)
    assert mine.pk == other.pk and mine.occurrences == 2
    assert Alert.objects.count() == 1


@pytest.mark.race
@pytest.mark.django_db(transaction=True)
def test_concurrent_workers_raising_one_condition_leave_one_alert():
    assert connection.vendor == "postgresql"
    workers = 8

    def raise_it():
        alert_raise(kind=AlertKind.DUPLICATE_CHARGE, dedupe_key="k:threads", detail="d", figures={}, now=NOON)

    run_together([raise_it] * workers, timeout=30)
    (alert,) = Alert.objects.all()
    assert alert.dedupe_key == "k:threads" and alert.occurrences == workers


# --------------------------------------------------------------------------- paid but not restored


def subscribe_and_fail(sim, email):
    customer = sim.create_customer(email, card="ok")
    sub_id = sim.create_subscription(customer, "price_monthly_pro", amount=4900)
    sim.set_card(customer, "insufficient_funds")
    invoice_id = sim.create_renewal_invoice(sub_id)
    sim.provider_attempt(invoice_id)
    return customer, sub_id, invoice_id


def first_paid_event_at(invoice_id):
    events = ProviderEvent.objects.filter(event_type__in=["invoice.paid", "invoice.payment_succeeded"],
                                          payload__data__object__id=invoice_id)
    return min(e.received_at for e in events)


def test_paid_event_stuck_in_the_inbox_alerts_after_60_seconds_and_resolves_once_restored(
        sim, clock, monkeypatch):
    _, sub_id, invoice_id = subscribe_and_fail(sim, "stuck@example.com")
    sim.deliver_all()
    cycle = DunningCycle.objects.get(invoice__provider_invoice_id=invoice_id)
    assert cycle.state == "RETRY_SCHEDULED" and cycle.subscription.entitlement_profile != "FULL"

    sim.customer_pays(invoice_id, update_card=True)
    with monkeypatch.context() as broker_down:  # stored in the inbox, never handed to a worker
        broker_down.setattr("dunning.evidence.intake._enqueue", lambda pk: None)
        sim.deliver_all()
    stuck = ProviderEvent.objects.filter(event_type__in=["invoice.paid", "invoice.payment_succeeded"],
                                         payload__data__object__id=invoice_id)
    assert {e.outcome for e in stuck} == {EventOutcome.PENDING} and stuck.count() == 2
    paid_at = first_paid_event_at(invoice_id)

    run_alerts(paid_at + timedelta(seconds=59))
    assert alerts_of(AlertKind.PAID_NOT_RESTORED) == [], "not before 60 s"

    record = run_alerts(paid_at + timedelta(seconds=61))
    (alert,) = alerts_of(AlertKind.PAID_NOT_RESTORED)
    assert record.changed == 1
    assert alert.invoice.provider_invoice_id == invoice_id
    assert alert.subscription.provider_subscription_id == sub_id
    assert alert.figures["unfinished_events"] == 2 and alert.figures["cycle_state"] == "RETRY_SCHEDULED"
    assert "RETRY_SCHEDULED" in alert.detail and invoice_id in alert.detail

    run_alerts(paid_at + timedelta(seconds=120))
    (alert,) = alerts_of(AlertKind.PAID_NOT_RESTORED)
    assert alert.occurrences == 2 and alert.resolved_at is None

    for event in ProviderEvent.objects.filter(outcome=EventOutcome.PENDING).order_by("received_at", "pk"):
        event_process(event_pk=event.pk)  # what the inbox sweep does
    cycle = DunningCycle.objects.select_related("subscription").get(pk=cycle.pk)
    assert cycle.state == "RECOVERED" and cycle.subscription.entitlement_profile == "FULL"

    resolved_now = paid_at + timedelta(seconds=180)
    record = run_alerts(resolved_now)
    (alert,) = alerts_of(AlertKind.PAID_NOT_RESTORED)
    assert (alert.resolved_at, alert.resolved_by) == (resolved_now, "job:alerts")
    assert record.changed == 1
    run_alerts(paid_at + timedelta(seconds=240))
    assert len(alerts_of(AlertKind.PAID_NOT_RESTORED)) == 1, "a restored invoice raises nothing new"


def test_restored_payment_raises_nothing_while_a_stuck_one_beside_it_does(sim, clock, monkeypatch):
    _, _, restored = subscribe_and_fail(sim, "fine@example.com")
    sim.customer_pays(restored, update_card=True)
    sim.deliver_all()
    assert DunningCycle.objects.get(invoice__provider_invoice_id=restored).state == "RECOVERED"
    _, _, stuck = subscribe_and_fail(sim, "stuck-beside@example.com")
    sim.deliver_all()
    sim.customer_pays(stuck, update_card=True)
    with monkeypatch.context() as broker_down:
        broker_down.setattr("dunning.evidence.intake._enqueue", lambda pk: None)
        sim.deliver_all()
    run_alerts(max(first_paid_event_at(restored), first_paid_event_at(stuck)) + timedelta(minutes=2))
    (alert,) = alerts_of(AlertKind.PAID_NOT_RESTORED)
    assert alert.figures["provider_invoice_id"] == stuck


def test_paying_one_of_two_open_invoices_is_not_an_alert_while_the_other_still_blocks(sim, clock):
    customer, sub_id, first = subscribe_and_fail(sim, "two@example.com")
    second = sim.create_renewal_invoice(sub_id)
    sim.provider_attempt(second)
    sim.deliver_all()
    sim.customer_pays(first)  # only the first; the card still fails for the second
    sim.deliver_all()
    assert DunningCycle.objects.get(invoice__provider_invoice_id=first).state == "RECOVERED"
    sub = Subscription.objects.get(provider_subscription_id=sub_id)
    assert sub.entitlement_profile == "READ_EXPORT_NO_NEW_JOBS"
    run_alerts(first_paid_event_at(first) + timedelta(minutes=2))
    assert alerts_of(AlertKind.PAID_NOT_RESTORED) == []


def test_settled_cycle_with_subscription_left_limited_alerts(policy, clock):
    sub = make_subscription()
    cycle = open_cycle(sub)
    fail_first_payment(cycle)
    assert accept(cycle, "recover", evidence=paid_evidence(reload(cycle))).accepted
    paid_fact = MonetaryFact.objects.get(invoice=cycle.invoice, kind=FactKind.PAYMENT_SUCCEEDED)
    run_alerts(paid_fact.recorded_at + timedelta(minutes=2))
    assert alerts_of(AlertKind.PAID_NOT_RESTORED) == []

    Subscription.objects.filter(pk=sub.pk).update(entitlement_profile="SUSPENDED")  # access left behind
    run_alerts(paid_fact.recorded_at + timedelta(minutes=3))
    (alert,) = alerts_of(AlertKind.PAID_NOT_RESTORED)
    assert alert.subscription_id == sub.pk and "no blocking cycle remains" in alert.detail
    assert "SUSPENDED" in alert.detail


# --------------------------------------------------------------------------- duplicate charges


@pytest.fixture
def paid_cycle(policy, clock):
    sub = make_subscription()
    cycle = open_cycle(sub, amount=4900)
    assert accept(cycle, "recover", evidence=paid_evidence(reload(cycle))).accepted
    return reload(cycle)


def success_fact(cycle, ref, n):
    return MonetaryFact.objects.create(
        kind=FactKind.PAYMENT_SUCCEEDED, invoice=cycle.invoice, cycle=cycle, amount=cycle.amount,
        currency=cycle.currency, provider_ref=ref, dedupe_key=f"test-success:{cycle.pk}:{n}", occurred_at=NOON,
        recorded_at=NOON,
    )


def succeeded_attempt(cycle, ref):
    return PaymentAttempt.objects.create(
        cycle=cycle, origin="LOCAL", idempotency_key=f"test-{ref}", invoice_digest="x" * 64, amount=cycle.amount,
        currency=cycle.currency, state="SUCCEEDED", provider_payment_ref=ref, created_at=NOON, resolved_at=NOON,
    )


def charge_event(cycle, charge, n):
    return ProviderEvent.objects.create(
        event_id=f"evt_test_{cycle.pk}_{n}", event_type="charge.succeeded", account="acct_test",
        payload={"id": f"evt_test_{cycle.pk}_{n}", "type": "charge.succeeded",
                 "data": {"object": {"id": charge, "object": "charge"}}},
        signature_verified=True, received_at=NOON, processed_at=NOON, outcome=EventOutcome.APPLIED,
        subscription=cycle.subscription, invoice=cycle.invoice, cycle=cycle,
    )


ADD_CHARGE = {
    "facts": lambda cycle, ref, n: success_fact(cycle, ref, n),
    "attempts": lambda cycle, ref, n: succeeded_attempt(cycle, f"{ref}-{n}"),
    "events": lambda cycle, ref, n: charge_event(cycle, ref, n),
}


@pytest.mark.parametrize("source", sorted(ADD_CHARGE))
def test_two_successful_charges_for_one_invoice_alert_once(paid_cycle, source):
    add = ADD_CHARGE[source]
    add(paid_cycle, "pi_first", 1)
    if source != "attempts":
        add(paid_cycle, "pi_first", 2)  # the same payment reported twice is one charge
    now = NOON + timedelta(minutes=1)
    run_alerts(now)
    assert alerts_of(AlertKind.DUPLICATE_CHARGE) == [], "one charge is not a duplicate"

    add(paid_cycle, "pi_second", 3)
    record = run_alerts(now + timedelta(minutes=1))
    (alert,) = alerts_of(AlertKind.DUPLICATE_CHARGE)
    assert record.changed == 1
    assert alert.invoice_id == paid_cycle.invoice_id and alert.subscription_id == paid_cycle.subscription_id
    assert paid_cycle.invoice.provider_invoice_id in alert.detail
    if source == "facts":
        assert alert.figures["payment_refs"] == ["pi_first", "pi_second"]
    elif source == "attempts":
        assert alert.figures["succeeded_attempts"] == 2
    else:
        assert alert.figures["charges"] == ["pi_first", "pi_second"]

    run_alerts(now + timedelta(minutes=2))
    (alert,) = alerts_of(AlertKind.DUPLICATE_CHARGE)
    assert alert.occurrences == 2, "the rerun is counted on the same alert"


# --------------------------------------------------------------------------- failure-rate spike


def add_attempts(invoice, *, days_ago, failed, succeeded):
    at = NOON - timedelta(days=days_ago, hours=1)
    base = MonetaryFact.objects.count()
    MonetaryFact.objects.bulk_create([
        MonetaryFact(kind=FactKind.PAYMENT_FAILED if i < failed else FactKind.PAYMENT_SUCCEEDED, invoice=invoice,
                     amount=100, currency="usd", dedupe_key=f"rate:{days_ago}:{base + i}", occurred_at=at,
                     recorded_at=at)
        for i in range(failed + succeeded)
    ])


@pytest.fixture
def normal_week(policy):
    invoice = open_cycle(make_subscription()).invoice
    for day in range(1, 8):
        add_attempts(invoice, days_ago=day, failed=3, succeeded=27)  # 10 % a day
    return invoice


def test_failure_rate_twice_the_weekly_mean_alerts_once_a_day(normal_week):
    add_attempts(normal_week, days_ago=0, failed=12, succeeded=18)  # 40 % against a 10 % mean
    rates = failure_rates(NOON)
    assert rates["today"] == {"failed": 12, "attempts": 30, "rate": 0.4}
    assert rates["baseline_days"] == 7 and rates["baseline_mean"] == pytest.approx(0.1)
    run_alerts(NOON)
    (alert,) = alerts_of(AlertKind.FAILURE_RATE_SPIKE)
    assert "12 of 30" in alert.detail and alert.figures["threshold"] == pytest.approx(0.2)
    run_alerts(NOON + timedelta(minutes=1))
    (alert,) = alerts_of(AlertKind.FAILURE_RATE_SPIKE)
    assert alert.occurrences == 2


@pytest.mark.parametrize(("failed", "succeeded", "why"), [
    (4, 26, "13 % is a normal day"),
    (5, 5, "50 % of 10 attempts is too small a sample"),
])
def test_no_spike_alert(normal_week, failed, succeeded, why):
    add_attempts(normal_week, days_ago=0, failed=failed, succeeded=succeeded)
    run_alerts(NOON)
    assert alerts_of(AlertKind.FAILURE_RATE_SPIKE) == [], why


def test_spike_factor_and_sample_come_from_settings(normal_week, settings):
    add_attempts(normal_week, days_ago=0, failed=4, succeeded=6)  # 40 % of 10
    run_alerts(NOON)
    assert alerts_of(AlertKind.FAILURE_RATE_SPIKE) == []
    settings.DUNNING_FAILURE_SPIKE_MIN_ATTEMPTS = 10
    settings.DUNNING_FAILURE_SPIKE_FACTOR = 5.0  # threshold 50 %
    run_alerts(NOON)
    assert alerts_of(AlertKind.FAILURE_RATE_SPIKE) == []
    settings.DUNNING_FAILURE_SPIKE_FACTOR = 3.0  # threshold 30 %
    run_alerts(NOON)
    assert len(alerts_of(AlertKind.FAILURE_RATE_SPIKE)) == 1


def test_days_without_attempts_are_left_out_of_the_mean(policy):
    invoice = open_cycle(make_subscription()).invoice
    add_attempts(invoice, days_ago=3, failed=3, succeeded=27)  # the only day with attempts: 10 %
    add_attempts(invoice, days_ago=0, failed=5, succeeded=20)  # 20 %: exactly twice the mean is not above it
    rates = failure_rates(NOON)
    assert rates["baseline_days"] == 1 and rates["baseline_mean"] == pytest.approx(0.1)
    run_alerts(NOON)
    assert alerts_of(AlertKind.FAILURE_RATE_SPIKE) == []
    add_attempts(invoice, days_ago=0, failed=1, succeeded=0)  # 6 of 26: 23 %
    run_alerts(NOON)
    assert len(alerts_of(AlertKind.FAILURE_RATE_SPIKE)) == 1
