"""Provider events become evidence, evidence becomes accepted transitions (SPEC §8), with the
simulator as the provider and its ledger as the monetary truth."""

from __future__ import annotations

import itertools

import pytest

from dunning.models import DunningCycle, EventOutcome, FactKind, MonetaryFact, OutboxMessage, ProviderEvent
from dunning.models import TransitionReceipt as Receipt
from subscriptions.models import Subscription


def subscribe(sim, *, price="price_monthly_pro", card="ok", amount=4900, email="payer@example.com"):
    customer = sim.create_customer(email, card=card)
    sub_id = sim.create_subscription(customer, price, amount=amount)
    return customer, sub_id


def local_cycle(invoice_id: str) -> DunningCycle:
    return DunningCycle.objects.select_related("subscription", "invoice").get(invoice__provider_invoice_id=invoice_id)


def test_new_subscription_is_imported_with_a_first_full_snapshot(sim):
    _, sub_id = subscribe(sim)
    sim.deliver_all()
    sub = Subscription.objects.get(provider_subscription_id=sub_id)
    assert (sub.entitlement_profile, sub.entitlement_generation) == ("FULL", 1)
    assert sub.policy.identity == "standard-monthly@6"
    assert sub.customer.email == "payer@example.com"
    assert not ProviderEvent.objects.filter(outcome__in=[EventOutcome.PENDING, EventOutcome.FAILED]).exists()


@pytest.mark.parametrize("api_shape", ["current", "legacy"], indirect=True)
def test_failed_renewal_enters_grace_with_provider_retry_as_evidence(sim, api_shape):
    customer, sub_id = subscribe(sim)
    sim.deliver_all()
    sim.set_card(customer, "insufficient_funds")
    invoice_id = sim.create_renewal_invoice(sub_id)
    sim.provider_attempt(invoice_id)
    sim.deliver_all()
    cycle = local_cycle(invoice_id)
    assert cycle.state == "RETRY_SCHEDULED"
    remote = sim.store.get(invoice_id)
    assert cycle.next_attempt_at is not None
    assert int(cycle.next_attempt_at.timestamp()) == remote["next_payment_attempt"]
    assert cycle.subscription.entitlement_profile == "READ_EXPORT_NO_NEW_JOBS"
    assert cycle.failure_class == "RETRYABLE" and cycle.decline_code == "insufficient_funds"
    assert len(sim.successful_charges(invoice_id)) == 0

    later = remote["next_payment_attempt"] + 86400
    sim.reschedule(invoice_id, later)
    sim.deliver_all()
    cycle = local_cycle(invoice_id)
    assert int(cycle.next_attempt_at.timestamp()) == later
    assert Receipt.objects.filter(cycle=cycle, edge="reschedule_retry", accepted=True).count() == 1


def test_hard_decline_is_never_retried_and_asks_the_customer(sim):
    customer, sub_id = subscribe(sim)
    sim.set_card(customer, "stolen_card")
    invoice_id = sim.create_renewal_invoice(sub_id)
    sim.provider_attempt(invoice_id)
    sim.deliver_all()
    cycle = local_cycle(invoice_id)
    assert cycle.state == "GRACE_ACTIVE"
    assert cycle.failure_class == "NON_RETRYABLE" and cycle.customer_action_required
    assert cycle.next_attempt_at is None
    assert not Receipt.objects.filter(cycle=cycle, edge="schedule_retry").exists()


def test_late_failure_webhook_after_payment_does_not_restrict_again(sim):
    """The seed's opening story: the customer paid; an old failure notification arrives late."""
    customer, sub_id = subscribe(sim)
    sim.deliver_all()
    sim.set_card(customer, "insufficient_funds")
    invoice_id = sim.create_renewal_invoice(sub_id)
    sim.provider_attempt(invoice_id)
    failure_events = [e["id"] for e in sim.pending_events() if e["type"] == "invoice.payment_failed"]
    sim.customer_pays(invoice_id, update_card=True)
    # Everything but the failure first; then the stale failure.
    for event in sim.pending_events():
        if event["id"] not in failure_events:
            sim.deliver(event["id"])
    cycle = local_cycle(invoice_id)
    assert cycle.state == "RECOVERED" and cycle.subscription.entitlement_profile == "FULL"
    generation = cycle.subscription.entitlement_generation
    for event_id in failure_events:
        sim.deliver(event_id)
    cycle = local_cycle(invoice_id)
    assert cycle.state == "RECOVERED"
    assert cycle.subscription.entitlement_profile == "FULL"
    assert cycle.subscription.entitlement_generation == generation
    late = ProviderEvent.objects.get(event_id=failure_events[0])
    assert late.outcome == EventOutcome.NO_CHANGE


def test_every_delivery_order_ends_in_the_state_of_the_latest_provider_object(sim):
    """Equal `created` values, every permutation: nothing orders by arrival or by `created`."""
    frozen = sim.now()
    sim.clock = lambda: frozen
    outcomes = set()
    for n, order in enumerate(itertools.permutations(range(4))):
        customer, sub_id = subscribe(sim, email=f"perm{n}@example.com")
        sim.set_card(customer, "insufficient_funds")
        invoice_id = sim.create_renewal_invoice(sub_id)
        sim.provider_attempt(invoice_id)
        sim.customer_pays(invoice_id, update_card=True)
        events = [e for e in sim.pending_events() if e["data"]["object"].get("id") == invoice_id]
        assert len({e["created"] for e in events}) == 1
        chosen = [events[i % len(events)]["id"] for i in order]
        for event_id in dict.fromkeys(chosen):
            sim.deliver(event_id)
        sim.deliver_all()
        cycle = local_cycle(invoice_id)
        outcomes.add((cycle.state, cycle.subscription.entitlement_profile, cycle.invoice.status))
    assert outcomes == {("RECOVERED", "FULL", "paid")}


def test_void_and_uncollectible_follow_the_policy_mapping(sim):
    customer, sub_id = subscribe(sim)
    sim.set_card(customer, "insufficient_funds")
    a = sim.create_renewal_invoice(sub_id)
    sim.provider_attempt(a)
    sim.mark_uncollectible(a)
    sim.deliver_all()
    cycle = local_cycle(a)
    assert cycle.invoice.status == "uncollectible"
    assert cycle.subscription.entitlement_profile == "READ_EXPORT_NO_NEW_JOBS"  # uncollectible is still debt
    assert MonetaryFact.objects.filter(invoice=cycle.invoice, kind=FactKind.MARKED_UNCOLLECTIBLE).count() == 1
    sim.void(a)
    sim.deliver_all()
    cycle = local_cycle(a)
    assert cycle.state == "CLOSED_VOID" and cycle.subscription.entitlement_profile == "FULL"
    assert MonetaryFact.objects.filter(invoice=cycle.invoice, kind=FactKind.INVOICE_VOIDED).count() == 1


@pytest.mark.parametrize("api_shape", ["current", "legacy"], indirect=True)
def test_lost_dispute_after_payment_reopens_debt_per_policy(sim, api_shape):
    _, sub_id = subscribe(sim)
    invoice_id = sim.create_renewal_invoice(sub_id)
    sim.provider_attempt(invoice_id)
    sim.deliver_all()
    cycle = local_cycle(invoice_id)
    assert cycle.state == "RECOVERED"
    charge = sim.successful_charges(invoice_id)[0]["id"]
    dispute = sim.open_dispute(charge)
    sim.deliver_all()
    assert MonetaryFact.objects.filter(invoice=cycle.invoice, kind=FactKind.DISPUTE_OPENED).count() == 1
    assert local_cycle(invoice_id).state == "RECOVERED"
    sim.close_dispute(dispute, won=False)
    sim.deliver_all()
    cycle = local_cycle(invoice_id)
    assert MonetaryFact.objects.filter(invoice=cycle.invoice, kind=FactKind.DISPUTE_LOST).count() == 1
    assert cycle.dispute_reopened and cycle.state == "GRACE_ACTIVE"
    assert cycle.subscription.entitlement_profile == "READ_EXPORT_NO_NEW_JOBS"


@pytest.mark.parametrize("api_shape", ["current", "legacy"], indirect=True)
def test_refunds_are_recorded_as_facts_without_access_change(sim, api_shape):
    _, sub_id = subscribe(sim)
    invoice_id = sim.create_renewal_invoice(sub_id)
    sim.provider_attempt(invoice_id)
    sim.deliver_all()
    charge = sim.successful_charges(invoice_id)[0]["id"]
    sim.refund(charge, 1000)
    sim.deliver_all()
    sim.refund(charge)
    sim.deliver_all()
    cycle = local_cycle(invoice_id)
    refunds = MonetaryFact.objects.filter(invoice=cycle.invoice, kind=FactKind.REFUNDED).order_by("amount")
    # Each fact is the increment refunded (1000, then the remaining 3900), so they sum to the money.
    assert [f.amount for f in refunds] == [1000, 3900] and sum(f.amount for f in refunds) == 4900
    assert cycle.state == "RECOVERED" and cycle.subscription.entitlement_profile == "FULL"


def test_amount_mismatch_is_quarantined_without_access_change(sim):
    customer, sub_id = subscribe(sim)
    sim.set_card(customer, "insufficient_funds")
    invoice_id = sim.create_renewal_invoice(sub_id)
    sim.deliver_all()
    cycle = local_cycle(invoice_id)
    generation = cycle.subscription.entitlement_generation
    sim.store.get(invoice_id)["amount_due"] += 1  # the provider's object changed under us
    sim.provider_attempt(invoice_id)
    sim.deliver_all()
    cycle = local_cycle(invoice_id)
    assert cycle.state == "CURRENT" and cycle.subscription.entitlement_generation == generation
    quarantined = ProviderEvent.objects.filter(outcome=EventOutcome.QUARANTINED)
    assert quarantined.exists() and "amount due changed" in quarantined.first().outcome_detail



def test_events_are_all_attributed(sim):
    customer, sub_id = subscribe(sim)
    sim.set_card(customer, "insufficient_funds")
    invoice_id = sim.create_renewal_invoice(sub_id)
    sim.provider_attempt(invoice_id)
    sim.customer_pays(invoice_id, update_card=True)
    sim.deliver_all(order="shuffled", seed=7)
    unattributed = ProviderEvent.objects.filter(subscription__isnull=True).exclude(
        outcome__in=[EventOutcome.IGNORED])
    assert not unattributed.exists(), list(unattributed.values_list("event_type", "outcome", "outcome_detail"))
    # Whatever arrived first was processed against the provider's current (paid) invoice, so the
    # failure never reached access: generation 1 (FULL) is still the only one.
    cycle = local_cycle(invoice_id)
    assert cycle.state == "RECOVERED"
    assert list(OutboxMessage.objects.filter(topic="entitlement.changed", subscription=cycle.subscription)
                .values_list("payload__generation", flat=True)) == [1]



def test_contradicting_receipts_put_the_cycle_in_evidence_conflict(sim):
    """A payment recorded as succeeded, then the provider's own fresh fetch says it failed: a
    person must decide; access moves in neither direction meanwhile."""
    _, sub_id = subscribe(sim)
    invoice_id = sim.create_renewal_invoice(sub_id)
    sim.provider_attempt(invoice_id)
    sim.deliver_all()
    cycle = local_cycle(invoice_id)
    assert cycle.state == "RECOVERED"
    paid = MonetaryFact.objects.get(invoice=cycle.invoice, kind=FactKind.PAYMENT_SUCCEEDED)
    intent = sim.store.get(paid.provider_ref)
    intent["status"] = "requires_payment_method"  # the provider now contradicts its earlier receipt
    sim._emit("payment_intent.payment_failed", intent)
    sim.deliver_all()
    cycle = local_cycle(invoice_id)
    assert cycle.state == "EVIDENCE_CONFLICT"
    assert paid.provider_ref in cycle.conflict_reason
    assert cycle.subscription.entitlement_profile == "FULL"
    assert MonetaryFact.objects.filter(pk=paid.pk).exists()


def test_a_draft_may_change_until_it_is_final_and_the_failure_then_enters_dunning(sim):
    """Usage lines added to a draft before finalization are legitimate: the cycle takes the final
    amount, and the renewal's failure is dunned instead of quarantined (issue 15, item 2)."""
    customer, sub_id = subscribe(sim)
    sim.deliver_all()
    invoice_id = sim.create_renewal_invoice(sub_id, finalize=False)
    sim.deliver_all()
    draft = local_cycle(invoice_id)
    assert (draft.invoice.status, draft.amount) == ("draft", 4900)
    sim.store.get(invoice_id)["amount_due"] = 5600  # a usage line added while the invoice is a draft
    sim.finalize(invoice_id)
    sim.set_card(customer, "insufficient_funds")
    sim.provider_attempt(invoice_id)
    sim.deliver_all()
    cycle = local_cycle(invoice_id)
    assert cycle.amount == 5600 and cycle.state in ("GRACE_ACTIVE", "RETRY_SCHEDULED"), cycle.state
    assert not ProviderEvent.objects.filter(outcome=EventOutcome.QUARANTINED).exists()
    revised = Receipt.objects.get(cycle=cycle, edge="revise_draft_amount", accepted=True)
    assert "4900 → 5600" in revised.detail


def test_after_finalization_a_changed_amount_is_quarantined_with_both_amounts(sim):
    customer, sub_id = subscribe(sim)
    sim.deliver_all()
    invoice_id = sim.create_renewal_invoice(sub_id)
    sim.deliver_all()
    sim.store.get(invoice_id)["amount_due"] = 5600
    sim.set_card(customer, "insufficient_funds")
    sim.provider_attempt(invoice_id)
    sim.deliver_all()
    held = ProviderEvent.objects.filter(outcome=EventOutcome.QUARANTINED).first()
    assert held is not None and "cycle holds 4900 usd, provider shows 5600 usd" in held.outcome_detail
    assert local_cycle(invoice_id).state == "CURRENT"
