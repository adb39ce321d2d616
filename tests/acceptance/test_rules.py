"""SPEC §6–§7: compare-and-set refusals, the two-invoice rule, append-only evidence."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import timedelta

import pytest

from dunning.acceptance.aggregate import EMPTY_ROOT
from dunning.acceptance.inputs import Expect
from dunning.append_only import AppendOnlyViolation
from dunning.models import MonetaryFact, OutboxMessage, TransitionReceipt
from entitlements.models import EntitlementSnapshot
from tests.support.builders import accept, make_policy, make_subscription, open_cycle, paid_evidence, reload
from tests.support.paths import Walker


@pytest.fixture
def grace_cycle(policy):
    return Walker(open_cycle(make_subscription())).to_grace()


@pytest.mark.parametrize("field,value,reason", [
    ("cycle_generation", -1, "STALE_CYCLE_GENERATION"),
    ("invoice_revision", 999, "STALE_INVOICE_REVISION"),
    ("root", EMPTY_ROOT, "STALE_ROOT"),
    ("policy_id", 0, "POLICY_MISMATCH"),
    ("attempt_id", uuid.uuid4(), "STALE_ATTEMPT"),
])
def test_stale_expectation_is_rejected_with_a_receipt_and_nothing_changes(grace_cycle, field, value, reason):
    w = grace_cycle
    cycle = reload(w.cycle)
    expect = Expect.from_cycle(cycle)
    if field == "cycle_generation":
        value = expect.cycle_generation - 1
    stale = replace(expect, **{field: value})
    counts = (EntitlementSnapshot.objects.count(), OutboxMessage.objects.count(), MonetaryFact.objects.count())
    result = accept(cycle, "recover", evidence=paid_evidence(cycle, now=w.now), now=w.now, expect=stale)
    assert not result.accepted and result.reason == reason
    after = reload(cycle)
    assert (after.state, after.generation, after.invoice.revision, after.invoice.status) == (
        cycle.state, cycle.generation, cycle.invoice.revision, cycle.invoice.status)
    assert after.subscription.entitlement_generation == cycle.subscription.entitlement_generation
    assert (EntitlementSnapshot.objects.count(), OutboxMessage.objects.count(), MonetaryFact.objects.count()) == counts
    rejection = TransitionReceipt.objects.get(pk=result.receipt_id)
    assert rejection.rejection_reason == reason and not rejection.accepted
    assert rejection.expected[field] == (str(value) if field == "attempt_id" else value)
    assert rejection.observed["state"] == "GRACE_ACTIVE"


def test_two_open_invoices_one_paid_stays_restricted(policy):
    sub = make_subscription()
    a = Walker(open_cycle(sub))
    b = Walker(open_cycle(sub))
    a.to_restricted()
    b.now = a.now
    b.to_restricted()
    sub.refresh_from_db()
    assert sub.entitlement_profile == "SUSPENDED"
    generation_restricted = sub.entitlement_generation
    snapshots = EntitlementSnapshot.objects.filter(subscription=sub).count()

    a.step("recover", evidence=paid_evidence(a.cycle, now=a.now))
    sub.refresh_from_db()
    assert a.cycle.state == "RECOVERED"
    assert sub.entitlement_profile == "SUSPENDED"
    assert sub.entitlement_generation == generation_restricted
    assert EntitlementSnapshot.objects.filter(subscription=sub).count() == snapshots
    assert not EntitlementSnapshot.objects.filter(subscription=sub, profile="FULL",
                                                  generation__gt=generation_restricted).exists()
    assert sub.outstanding_cycle_root != EMPTY_ROOT

    b.step("recover", evidence=paid_evidence(b.cycle, now=b.now))
    sub.refresh_from_db()
    assert (sub.entitlement_profile, sub.entitlement_generation) == ("FULL", generation_restricted + 1)
    assert sub.outstanding_cycle_root == EMPTY_ROOT
    latest = EntitlementSnapshot.objects.filter(subscription=sub).latest()
    assert (latest.profile, latest.generation) == ("FULL", generation_restricted + 1)
    assert OutboxMessage.objects.filter(topic="entitlement.changed",
                                        dedupe_key=f"entitlement.changed:{sub.pk}:{latest.generation}").exists()


def test_new_invoice_never_overwrites_older_debt(policy):
    sub = make_subscription()
    old = Walker(open_cycle(sub)).to_grace()
    root_with_debt = reload(old.cycle).subscription.outstanding_cycle_root
    open_cycle(sub)  # next month's invoice: CURRENT, not blocking
    sub.refresh_from_db()
    assert sub.outstanding_cycle_root == root_with_debt
    assert sub.entitlement_profile == "READ_EXPORT_NO_NEW_JOBS"


def test_recover_with_remaining_debt_policy_restores_early(db):
    make_policy(policy="generous@1", recover_with_remaining_debt=True, applies_to={"prices": ["price_gen"]})
    sub = make_subscription(price="price_gen")
    w = Walker(open_cycle(sub)).to_grace()
    assert reload(w.cycle).subscription.entitlement_profile == "FULL"


def test_shadow_mode_records_decision_without_access_change(db):
    make_policy(policy="shadow@1", mode="SHADOW", applies_to={"prices": ["price_shadow"]})
    sub = make_subscription(price="price_shadow")
    w = Walker(open_cycle(sub)).to_restricted()
    sub.refresh_from_db()
    assert (sub.entitlement_profile, sub.entitlement_generation) == ("FULL", 1)
    last = TransitionReceipt.objects.filter(cycle=w.cycle, accepted=True).latest("id")
    assert last.decision_profile == "SUSPENDED" and "mode SHADOW" in last.detail
    assert not OutboxMessage.objects.filter(subscription=sub, topic="notification.requested").exists()


def test_facts_are_recorded_once_per_dedupe_key(grace_cycle):
    w = grace_cycle
    evidence = paid_evidence(w.cycle, now=w.now)
    result = accept(w.cycle, "recover", evidence=evidence, now=w.now)
    assert result.facts_recorded == 1
    again = accept(w.cycle, "record_evidence", evidence=evidence, now=w.now)
    assert again.accepted and again.facts_recorded == 0
    assert MonetaryFact.objects.filter(invoice=w.cycle.invoice).count() == 1


def test_evidence_tables_refuse_rewrite_and_delete(grace_cycle):
    w = grace_cycle
    accept(w.cycle, "recover", evidence=paid_evidence(w.cycle, now=w.now), now=w.now)
    fact = MonetaryFact.objects.get(invoice=w.cycle.invoice)
    fact.amount = 1
    with pytest.raises(AppendOnlyViolation):
        fact.save()
    with pytest.raises(AppendOnlyViolation):
        fact.delete()
    with pytest.raises(AppendOnlyViolation):
        MonetaryFact.objects.filter(pk=fact.pk).update(amount=1)
    with pytest.raises(AppendOnlyViolation):
        MonetaryFact.objects.all().delete()
    receipt = TransitionReceipt.objects.filter(cycle=w.cycle).first()
    with pytest.raises(AppendOnlyViolation):
        TransitionReceipt.objects.filter(pk=receipt.pk).update(accepted=False)
    snapshot = EntitlementSnapshot.objects.first()
    with pytest.raises(AppendOnlyViolation):
        snapshot.delete()
    # Outbox bookkeeping may change; its payload may not.
    message = OutboxMessage.objects.first()
    OutboxMessage.objects.filter(pk=message.pk).update(delivery_attempts=1)
    with pytest.raises(AppendOnlyViolation):
        OutboxMessage.objects.filter(pk=message.pk).update(payload={})
    assert MonetaryFact.objects.get(pk=fact.pk).amount == w.cycle.invoice.amount_due


def test_history_is_kept_for_cycles_and_subscriptions(grace_cycle):
    cycle = reload(grace_cycle.cycle)
    states = list(cycle.history.order_by("history_id").values_list("state", flat=True))
    assert states == ["CURRENT", "PAYMENT_FAILED", "GRACE_ACTIVE"]
    assert cycle.subscription.history.count() >= 3


def test_evidence_that_moves_nothing_is_receipted_but_leaves_the_subscription_row_alone(grace_cycle):
    cycle = reload(grace_cycle.cycle)
    sub = cycle.subscription
    versions, history = sub.row_version, sub.history.count()
    result = accept(cycle, "record_evidence", now=grace_cycle.now)
    assert result.accepted
    receipt = TransitionReceipt.objects.get(pk=result.receipt_id)
    assert receipt.root_before == receipt.root_after == sub.outstanding_cycle_root
    sub.refresh_from_db()
    assert (sub.row_version, sub.history.count()) == (versions, history)
    # A move of the root still writes the row and its history.
    moved = accept(reload(cycle), "recover", evidence=paid_evidence(cycle, now=grace_cycle.now), now=grace_cycle.now)
    assert moved.accepted
    sub.refresh_from_db()
    assert sub.row_version == versions + 1 and sub.history.count() == history + 1


def test_an_unknown_cycle_is_an_error_not_a_refusal(policy):
    from dunning.acceptance.inputs import Cause
    from dunning.acceptance.transitions import cycle_accept_transition
    from dunning.models import DunningCycle

    expect = Expect(cycle_generation=0, invoice_revision=0, attempt_id=None, policy_id=policy.pk, root=EMPTY_ROOT)
    with pytest.raises(DunningCycle.DoesNotExist):
        cycle_accept_transition(cycle_pk=987654321, edge="record_evidence", expect=expect, cause=Cause.system("t"))


def _row(instance) -> dict:
    return {f.attname: getattr(instance, f.attname) for f in type(instance)._meta.concrete_fields
            if not instance.get_deferred_fields() & {f.attname}}


@pytest.mark.parametrize("edge", ["recover", "schedule_retry"])
def test_an_accepted_result_carries_the_cycle_exactly_as_committed(grace_cycle, edge):
    """Jobs decide their next step on `result.cycle` instead of reading the row again, so it must
    hold what was committed: the cycle, its invoice, its pending attempt and its subscription."""
    w = grace_cycle
    cycle = reload(w.cycle)
    if edge == "recover":
        result = accept(cycle, "recover", evidence=paid_evidence(cycle, now=w.now), now=w.now)
    else:
        result = accept(cycle, "schedule_retry", now=w.now, next_attempt_at=w.now + timedelta(days=1))
    assert result.accepted, result

    stored = reload(cycle)
    carried = result.cycle
    assert _row(carried) == _row(stored)
    assert _row(carried.invoice) == _row(stored.invoice)
    assert _row(carried.subscription) == _row(stored.subscription)
    assert carried.pending_attempt_id == stored.pending_attempt_id
    assert carried.policy.digest == stored.policy.digest


def test_a_receipt_behind_the_invoice_mirror_is_refused_as_an_old_copy(grace_cycle):
    """A provider invoice never goes back: whoever brings a read of a paid invoice that shows it
    open (a lagging replica), the acceptance refuses it and the mirror stays paid (seed 1 found the
    cancellation job moving a paid mirror back to open this way)."""
    w = grace_cycle
    cycle = reload(w.cycle)
    assert accept(cycle, "recover", evidence=paid_evidence(cycle, now=w.now), now=w.now).accepted
    paid = reload(cycle)
    assert paid.invoice.status == "paid"
    old_copy = replace(paid_evidence(paid, now=w.now), facts=())
    old_copy = replace(old_copy, invoice=replace(old_copy.invoice, status="open", amount_paid=0))
    result = accept(paid, "record_evidence", evidence=old_copy, now=w.now + timedelta(minutes=1))
    assert not result.accepted and result.reason == "STALE_INVOICE_READ"
    after = reload(paid)
    assert (after.invoice.status, after.invoice.revision, after.generation) == (
        "paid", paid.invoice.revision, paid.generation)
    assert TransitionReceipt.objects.get(pk=result.receipt_id).rejection_reason == "STALE_INVOICE_READ"
