"""Money facts add up (issue 15, item 6): summing an invoice's facts gives its money. A refund
fact is the increment refunded (the charge's cumulative total is its evidence), dispute funds
withdrawn and reinstated are facts, and every fact names the payment attempt it came from."""

from __future__ import annotations

import functools
from datetime import timedelta

import pytest
from django.db.models import Sum
from django.utils import timezone

from dunning.acceptance.inputs import Cause, Evidence, FactSpec
from dunning.actions.local_retry import retry_dispatch
from dunning.jobs.framework import job_run
from dunning.models import DunningCycle, FactKind, MonetaryFact, PaymentAttempt, ProviderEvent
from tests.support.builders import accept, make_policy, make_subscription, open_cycle
from tests.support.threads import run_together

JOB = Cause.job("local_retry")


def subscribe(sim, *, price="price_monthly_pro", amount=4900, email="money@example.com"):
    customer = sim.create_customer(email, card="ok")
    return customer, sim.create_subscription(customer, price, amount=amount)


def paid_renewal(sim, **kwargs):
    customer, sub_id = subscribe(sim, **kwargs)
    invoice_id = sim.create_renewal_invoice(sub_id)
    sim.provider_attempt(invoice_id)
    sim.deliver_all()
    return customer, invoice_id, sim.successful_charges(invoice_id)[0]["id"]


def facts(invoice_id, kind):
    return list(MonetaryFact.objects.filter(invoice__provider_invoice_id=invoice_id, kind=kind).order_by("pk"))


def total(invoice_id, kind):
    return MonetaryFact.objects.filter(invoice__provider_invoice_id=invoice_id, kind=kind).aggregate(
        s=Sum("amount"))["s"] or 0


# ---- refunds: increments, with the cumulative total as evidence


@pytest.mark.parametrize("api_shape", ["current", "legacy"], indirect=True)
def test_two_partial_refunds_add_up_to_what_the_charge_refunded(sim, api_shape):
    _, invoice_id, charge = paid_renewal(sim)
    sim.refund(charge, 1000)
    sim.deliver_all()
    first_event = sim.events_of_type("charge.refunded")[-1]["id"]
    sim.refund(charge)  # the remaining 3900
    sim.deliver_all()
    sim.deliver(first_event)  # the first refund's webhook again, late: its charge now reads 4900

    refunds = facts(invoice_id, FactKind.REFUNDED)
    assert [(f.amount, f.cumulative_amount) for f in refunds] == [(1000, 1000), (3900, 4900)]
    assert sum(f.amount for f in refunds) == sim.get(charge)["amount_refunded"] == 4900
    assert all(f.provider_ref == charge for f in refunds)
    cycle = DunningCycle.objects.get(invoice__provider_invoice_id=invoice_id)
    assert cycle.state == "RECOVERED" and cycle.subscription.entitlement_profile == "FULL"


def test_a_refund_total_older_than_the_one_on_record_adds_nothing(policy):
    cycle = open_cycle(make_subscription(), amount=4900)

    def refund_seen(cumulative):
        spec = FactSpec(FactKind.REFUNDED, cumulative, "usd", f"refund:ch_1:{cumulative}", timezone.now(),
                        provider_ref="ch_1")
        assert accept(cycle, "record_evidence", evidence=Evidence(facts=(spec,))).accepted

    refund_seen(3000)
    refund_seen(1000)  # an older read of the same charge (a lagging replica): already covered
    refund_seen(3000)  # the same total again: the same fact
    refund_seen(4900)
    rows = list(MonetaryFact.objects.filter(invoice=cycle.invoice, kind=FactKind.REFUNDED).order_by("pk")
                .values_list("amount", "cumulative_amount", "dedupe_key"))
    assert rows == [(3000, 3000, "refund:ch_1:3000"), (1900, 4900, "refund:ch_1:4900")]


def test_a_refund_fact_written_before_increments_counts_as_the_cumulative_total(policy):
    cycle = open_cycle(make_subscription(), amount=4900)
    MonetaryFact.objects.create(kind=FactKind.REFUNDED, invoice=cycle.invoice, cycle=cycle, amount=2000,
                                currency="usd", provider_ref="ch_old", dedupe_key="refund:ch_old:2000",
                                occurred_at=timezone.now(), recorded_at=timezone.now())
    spec = FactSpec(FactKind.REFUNDED, 4900, "usd", "refund:ch_old:4900", timezone.now(), provider_ref="ch_old")
    assert accept(cycle, "record_evidence", evidence=Evidence(facts=(spec,))).accepted
    newest = MonetaryFact.objects.get(dedupe_key="refund:ch_old:4900")
    assert (newest.amount, newest.cumulative_amount) == (2900, 4900)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("totals", [(2450, 4900), (4900, 2450), (4900, 4900)], ids=["rising", "falling", "same"])
def test_concurrent_refund_events_claim_each_increment_once(totals):
    make_policy()
    cycle = open_cycle(make_subscription(), amount=4900)
    specs = [FactSpec(FactKind.REFUNDED, cumulative, "usd", f"refund:ch_race:{cumulative}", timezone.now(),
                      provider_ref="ch_race") for cumulative in totals]

    def refund_seen(spec):
        return accept(cycle, "record_evidence", evidence=Evidence(facts=(spec,))).accepted

    results = run_together([functools.partial(refund_seen, spec) for spec in specs], timeout=60)
    assert len(results) == len(totals)
    refunds = MonetaryFact.objects.filter(invoice=cycle.invoice, kind=FactKind.REFUNDED)
    assert sum(refunds.values_list("amount", flat=True)) == max(totals), list(refunds.values_list(
        "amount", "cumulative_amount"))
    assert max(refunds.values_list("cumulative_amount", flat=True)) == max(totals)


# ---- disputes: funds withdrawn and reinstated, from the fetched dispute's balance transactions


@pytest.mark.parametrize("api_shape", ["current", "legacy"], indirect=True)
def test_dispute_funds_withdrawn_and_reinstated_are_facts(sim, api_shape):
    _, invoice_id, charge = paid_renewal(sim)
    dispute = sim.open_dispute(charge)
    created = sim.events_of_type("charge.dispute.created")[-1]["id"]
    sim.deliver(created)  # charge.dispute.funds_withdrawn never arrives: the fetched dispute shows it
    (withdrawn,) = facts(invoice_id, FactKind.DISPUTE_FUNDS_WITHDRAWN)
    assert (withdrawn.amount, withdrawn.currency) == (4900, "usd")
    (movement,) = sim.retrieve(dispute)["balance_transactions"]
    assert movement["amount"] == -4900 and withdrawn.dedupe_key == f"dispute_funds:{dispute}:{movement['id']}"

    sim.close_dispute(dispute, won=True)
    sim.deliver_all()
    assert [f.amount for f in facts(invoice_id, FactKind.DISPUTE_FUNDS_WITHDRAWN)] == [4900]
    assert [f.amount for f in facts(invoice_id, FactKind.DISPUTE_FUNDS_REINSTATED)] == [4900]
    assert len(facts(invoice_id, FactKind.DISPUTE_WON)) == 1
    assert DunningCycle.objects.get(invoice__provider_invoice_id=invoice_id).state == "RECOVERED"


def test_a_lost_dispute_keeps_the_funds_withdrawn_and_reopens_the_debt(sim):
    _, invoice_id, charge = paid_renewal(sim)
    dispute = sim.open_dispute(charge)
    sim.deliver_all()
    sim.close_dispute(dispute, won=False)
    sim.deliver_all()
    assert total(invoice_id, FactKind.DISPUTE_FUNDS_WITHDRAWN) == 4900
    assert total(invoice_id, FactKind.DISPUTE_FUNDS_REINSTATED) == 0
    cycle = DunningCycle.objects.get(invoice__provider_invoice_id=invoice_id)
    assert cycle.dispute_reopened and cycle.state == "GRACE_ACTIVE"


def _sweep_after_a_minute(time_machine, event_type):
    """The event read an old copy and was kept pending; the inbox sweep asks again a minute later."""
    (event,) = ProviderEvent.objects.filter(event_type=event_type).order_by("-pk")[:1]
    assert event.outcome == "PENDING" and "stale read" in event.error, (event.outcome, event.error)
    time_machine.move_to(event.received_at + timedelta(seconds=61), tick=True)
    job_run("inbox_sweep")
    event.refresh_from_db()
    assert event.outcome == "APPLIED", (event.outcome, event.outcome_detail, event.error)


def test_a_stale_invoice_read_during_a_lost_dispute_neither_rewinds_the_mirror_nor_strands_the_cycle(
        sim, time_machine):
    """Seed 3 (3,000 steps): the lost dispute's event read an old copy of the paid invoice (open,
    never attempted), moved the mirror back to open and left the reopened cycle in PAYMENT_FAILED
    with no grace deadline; reconciliation then reported INVOICE_STATUS_DIFFERS every day."""
    time_machine.move_to("2026-12-01T09:00:00Z", tick=True)
    _, invoice_id, charge = paid_renewal(sim)
    dispute = sim.open_dispute(charge)
    sim.deliver_all()
    sim.close_dispute(dispute, won=False)
    sim.faults.stale_read(invoice_id, 20)  # every read of the invoice during the delivery lags
    sim.deliver_all()
    sim.faults.clear()
    cycle = DunningCycle.objects.select_related("invoice").get(invoice__provider_invoice_id=invoice_id)
    assert cycle.invoice.status == "paid" and cycle.state == "RECOVERED", "nothing was taken from the old copy"

    _sweep_after_a_minute(time_machine, "charge.dispute.closed")
    cycle = DunningCycle.objects.select_related("invoice").get(invoice__provider_invoice_id=invoice_id)
    assert cycle.invoice.status == "paid" and cycle.invoice.amount_paid == 4900
    assert cycle.dispute_reopened and cycle.state == "GRACE_ACTIVE" and cycle.grace_expires_at is not None
    assert total(invoice_id, FactKind.DISPUTE_FUNDS_WITHDRAWN) == 4900


def test_a_stale_invoice_read_during_a_refund_does_not_rewind_the_mirror(sim, time_machine):
    time_machine.move_to("2026-12-01T09:00:00Z", tick=True)
    _, invoice_id, charge = paid_renewal(sim)
    sim.refund(charge, 900)
    sim.faults.stale_read(invoice_id, 1)
    sim.deliver_all()
    cycle = DunningCycle.objects.select_related("invoice").get(invoice__provider_invoice_id=invoice_id)
    assert cycle.invoice.status == "paid" and cycle.state == "RECOVERED"
    _sweep_after_a_minute(time_machine, "charge.refunded")
    assert [f.amount for f in facts(invoice_id, FactKind.REFUNDED)] == [900]
    assert DunningCycle.objects.get(invoice__provider_invoice_id=invoice_id).invoice.status == "paid"


# ---- the attempt each fact came from


def test_a_provider_failure_links_to_the_provider_attempt_and_a_payment_without_our_attempt_to_none(sim):
    customer, sub_id = subscribe(sim)
    sim.set_card(customer, "insufficient_funds")
    invoice_id = sim.create_renewal_invoice(sub_id)
    sim.provider_attempt(invoice_id)
    sim.deliver_all()
    (failed,) = facts(invoice_id, FactKind.PAYMENT_FAILED)
    (attempt,) = PaymentAttempt.objects.filter(cycle__invoice__provider_invoice_id=invoice_id)
    assert attempt.origin == "PROVIDER" and attempt.state == "FAILED"
    assert failed.attempt_id == attempt.pk and attempt.provider_payment_ref == failed.provider_ref

    sim.customer_pays(invoice_id, update_card=True)  # on the hosted page: no attempt of ours
    sim.deliver_all()
    (paid,) = facts(invoice_id, FactKind.PAYMENT_SUCCEEDED)
    assert paid.attempt_id is None, "a success is never linked to a failed attempt that shares its payment intent"
    assert PaymentAttempt.objects.filter(cycle__invoice__provider_invoice_id=invoice_id).count() == 1


def test_a_local_retry_links_its_failure_its_payment_and_the_refund_of_it(sim):
    customer, sub_id = subscribe(sim, price="price_monthly_local", amount=3000, email="local@example.com")
    sim.set_card(customer, "insufficient_funds")
    invoice_id = sim.create_renewal_invoice(sub_id)
    sim.provider_attempt(invoice_id)
    sim.deliver_all()
    cycle = DunningCycle.objects.get(invoice__provider_invoice_id=invoice_id)
    assert accept(cycle, "schedule_retry", cause=JOB).accepted
    assert retry_dispatch(cycle_pk=cycle.pk, cause=JOB).status == "DECLINED"  # still declining
    sim.deliver_all()  # ...and its webhooks: the invoice's attempt 2, read fresh
    sim.set_card(customer, "ok")
    assert retry_dispatch(cycle_pk=cycle.pk, cause=JOB).status == "PAID"
    sim.deliver_all()
    declined, succeeded = PaymentAttempt.objects.filter(cycle=cycle, origin="LOCAL").order_by("pk")
    assert (declined.state, succeeded.state) == ("FAILED", "SUCCEEDED")
    renewal = PaymentAttempt.objects.get(cycle=cycle, origin="PROVIDER")

    by_key = {f.dedupe_key: f.attempt_id for f in facts(invoice_id, FactKind.PAYMENT_FAILED)}
    assert by_key == {
        f"failed:{invoice_id}:1": renewal.pk,  # the renewal charge, the provider's
        f"failed:{invoice_id}:{declined.idempotency_key}": declined.pk,  # the retry's own answer
        f"failed:{invoice_id}:2": declined.pk,  # the same charge as the provider's webhook reported it
    }
    (paid,) = facts(invoice_id, FactKind.PAYMENT_SUCCEEDED)
    assert paid.attempt_id == succeeded.pk

    sim.refund(sim.successful_charges(invoice_id)[0]["id"], 500)
    sim.deliver_all()
    (refund,) = facts(invoice_id, FactKind.REFUNDED)
    assert refund.attempt_id == succeeded.pk


def test_void_and_uncollectible_facts_name_no_attempt(sim):
    customer, sub_id = subscribe(sim)
    sim.set_card(customer, "insufficient_funds")
    invoice_id = sim.create_renewal_invoice(sub_id)
    sim.provider_attempt(invoice_id)
    sim.deliver_all()
    sim.mark_uncollectible(invoice_id)
    sim.deliver_all()
    sim.void(invoice_id)
    sim.deliver_all()
    assert facts(invoice_id, FactKind.PAYMENT_FAILED)[0].attempt_id is not None
    (uncollectible,) = facts(invoice_id, FactKind.MARKED_UNCOLLECTIBLE)
    (voided,) = facts(invoice_id, FactKind.INVOICE_VOIDED)
    assert uncollectible.attempt_id is None and voided.attempt_id is None
