"""A real race on PostgreSQL: payment versus restriction on the same cycle generation (SPEC §6)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection

from dunning.acceptance.inputs import Cause, Expect
from dunning.acceptance.settlement import compute_aggregate
from dunning.acceptance.transitions import cycle_accept_transition
from dunning.models import TransitionReceipt
from subscriptions.models import Subscription
from tests.support.builders import (
    clock_reaches,
    make_policy,
    make_subscription,
    open_cycle,
    paid_evidence,
    reload,
    unpaid_evidence,
)
from tests.support.paths import Walker
from tests.support.threads import run_together

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.race]


@pytest.mark.parametrize("round_", range(5))
def test_payment_versus_restriction_exactly_one_wins(round_):
    assert connection.vendor == "postgresql", "races must run on PostgreSQL"
    make_policy()
    sub = make_subscription()
    w = Walker(open_cycle(sub)).to_grace_expired()
    cycle = reload(w.cycle)
    expect = Expect.from_cycle(cycle)
    now = w.now + timedelta(seconds=1)
    paid = paid_evidence(cycle, now=now)
    unpaid = unpaid_evidence(cycle, now=now)

    def pay():
        return cycle_accept_transition(cycle_pk=cycle.pk, edge="recover", expect=expect,
                                       cause=Cause.event("evt_paid"), evidence=paid, now=now)

    def restrict():
        return cycle_accept_transition(cycle_pk=cycle.pk, edge="begin_restriction", expect=expect,
                                       cause=Cause.job("grace_sweep"), evidence=unpaid, now=now)

    with clock_reaches(now):
        results = run_together([pay, restrict])
    accepted = [r for r in results if r.accepted]
    rejected = [r for r in results if not r.accepted]
    assert len(accepted) == 1 and len(rejected) == 1, results
    loser = TransitionReceipt.objects.get(pk=rejected[0].receipt_id)
    assert loser.rejection_reason == "STALE_CYCLE_GENERATION"
    assert loser.expected["cycle_generation"] == expect.cycle_generation
    assert loser.observed["cycle_generation"] == expect.cycle_generation + 1

    final = reload(cycle)
    assert final.state == accepted[0].to_state
    assert final.generation == expect.cycle_generation + 1
    sub = Subscription.objects.get(pk=sub.pk)
    root, decision = compute_aggregate(sub, None)
    assert sub.outstanding_cycle_root == root
    assert sub.entitlement_profile == decision.profile


def test_concurrent_cycle_openings_for_one_invoice_create_one_cycle():
    make_policy()
    sub = make_subscription()
    from dunning.acceptance.opening import InvoiceFacts, cycle_open_for_invoice

    facts = InvoiceFacts(provider_invoice_id="in_race", amount_due=1000, currency="eur")

    def opener():
        return cycle_open_for_invoice(subscription_pk=sub.pk, invoice=facts, cause=Cause.event("evt_x")).pk

    pks = run_together([opener, opener, opener])
    assert len(set(pks)) == 1
