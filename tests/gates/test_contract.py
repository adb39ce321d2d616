"""The two gates of the contract line and the grace deadline: each fails on the case it guards
against and passes once the jobs have done their part."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from dunning.acceptance.inputs import Cause, ContractUpdate
from dunning.acceptance.subscription import subscription_accept_change
from dunning.gates import gates_evaluate
from dunning.jobs.framework import job_run
from entitlements.models import EntitlementSnapshot
from tests.support.builders import make_policy, make_subscription, open_cycle, reload
from tests.support.paths import Walker


def test_grace_overrun_counts_a_cycle_waiting_on_a_retry_past_its_deadline(db, time_machine, settings):
    settings.STRIPE_API_BASE = "http://127.0.0.1:9"  # nothing listens: the restriction's fetch fails at once
    make_policy()
    walker = Walker(open_cycle(make_subscription()), now=timezone.now()).to_retry_scheduled()
    cycle = reload(walker.cycle)
    time_machine.move_to(cycle.grace_expires_at + timedelta(seconds=30), tick=False)
    assert gates_evaluate().gate("grace_overrun").passed, "within one job period"
    time_machine.move_to(cycle.grace_expires_at + timedelta(minutes=5), tick=False)
    gate = gates_evaluate().gate("grace_overrun")
    assert not gate.passed and gate.offending == 1 and str(cycle.cycle_id) in gate.detail[0]
    job_run("grace_expiry")  # expiry needs no provider; the restriction waits for a fetch
    assert reload(cycle).state == "GRACE_EXPIRED"
    assert gates_evaluate().gate("grace_overrun").passed


def test_ended_contract_access_counts_full_access_after_the_end(db, time_machine, settings):
    settings.STRIPE_API_BASE = "http://127.0.0.1:9"  # the job decides on the contract as last fetched
    make_policy()
    sub = make_subscription()
    now = timezone.now()
    ending = ContractUpdate(status="active", price_ids=("price_test",), interval="month", fetched_at=now,
                            cancel_at_period_end=True, current_period_end=now + timedelta(days=1))
    assert subscription_accept_change(subscription_pk=sub.pk, change="contract_update", cause=Cause.system("t"),
                                      contract=ending, expect_contract_revision=sub.contract_revision)
    sub.refresh_from_db()
    assert sub.entitlement_profile == "FULL" and gates_evaluate().gate("ended_contract_access").passed
    time_machine.move_to(now + timedelta(days=1, minutes=5), tick=False)
    gate = gates_evaluate().gate("ended_contract_access")
    assert not gate.passed and sub.provider_subscription_id in gate.detail[0]
    job_run("contract_deadlines")
    sub.refresh_from_db()
    assert sub.entitlement_profile == "REVOKED"
    assert gates_evaluate().gate("ended_contract_access").passed
    # A FULL generation issued after the end is counted too, even once access is revoked again.
    EntitlementSnapshot.objects.create(subscription=sub, generation=sub.entitlement_generation + 1, profile="FULL",
                                       capabilities={}, reason="corrupted", issued_at=timezone.now(),
                                       cause_receipt=None)
    sub.contract_ended_at = now + timedelta(days=1)
    sub.save(update_fields=["contract_ended_at"])
    assert not gates_evaluate().gate("ended_contract_access").passed
