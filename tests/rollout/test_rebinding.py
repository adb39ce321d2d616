"""Rollback to the more permissive previous policy, and forward rebinding as a fenced, recorded,
idempotent job (issue 19 item 1). Neither ever writes a payment fact."""

from __future__ import annotations

import pytest

from dunning.acceptance.inputs import Cause
from dunning.acceptance.subscription import subscription_accept_change
from dunning.actions.incidents import IncidentError, previous_policy_version
from dunning.models import IncidentSwitch, JobRun, MonetaryFact, RolloutStage, TransitionReceipt
from dunning.rollout import rebinding
from dunning.rollout.errors import RolloutError
from dunning.rollout.rebinding import rollout_rebind_forward, rollout_rollback
from subscriptions.models import Subscription
from tests.rollout.conftest import grace, publish
from tests.support.builders import fail_first_payment, make_subscription, open_cycle, reload


@pytest.fixture
def three_versions(db):
    """v1 is kind (P10D, SUSPENDED); v2 has the longest grace but REVOKES; v3 (current) is strict."""
    v1 = publish(1, grace=grace("P10D"))
    v2 = publish(2, grace=grace("P14D"), restricted_profile="REVOKED")
    v3 = publish(3, grace=grace("P4D"))
    return v1, v2, v3


def test_the_more_permissive_previous_version_is_chosen_not_version_minus_one(three_versions):
    v1, v2, v3 = three_versions
    assert previous_policy_version(v3) == v1, "v2's longer grace does not make up for REVOKED"
    with pytest.raises(IncidentError, match="at least as permissive"):
        previous_policy_version(v2)  # v1's grace is shorter than v2's: rolling back would tighten it
    v4 = publish(4, grace=grace("P30D"), cancelAfter="MANUAL_ONLY", cancel_after_restricted=None)
    v5 = publish(5, grace=grace("P30D"))
    assert previous_policy_version(v5) == v4, "same grace, but v4 never cancels on a timer"


def test_no_previous_version_at_least_as_permissive_is_refused(db):
    publish(1, grace=grace("P4D"))
    current = publish(2, grace=grace("P7D"))
    with pytest.raises(IncidentError, match="at least as permissive"):
        previous_policy_version(current)


def test_rollback_rebinds_the_cohort_and_its_open_cycles_without_a_payment(three_versions, lead):
    v1, _, v3 = three_versions
    subs = [make_subscription() for _ in range(3)]
    assert {s.policy for s in subs} == {v3}
    cycle = open_cycle(subs[0])
    fail_first_payment(cycle)
    outcome = rollout_rollback(cohort="default", by=lead, reason="v3 grace too short", ticket="INC-19",
                               pause_restrictions=True)
    assert [(m.from_policy, m.to_policy, m.changed, m.refused) for m in outcome.moves] == [
        ("test-monthly@3", "test-monthly@1", 3, [])]
    assert set(Subscription.objects.values_list("policy_id", flat=True)) == {v1.pk}
    assert reload(cycle).policy == v1, "the kinder grace applies to the debt already open"
    assert IncidentSwitch.objects.get(ended_at__isnull=True).ticket == "INC-19"
    receipts = TransitionReceipt.objects.filter(edge="rebind_policy", accepted=True)
    assert receipts.count() == 3 and set(receipts.values_list("ticket", flat=True)) == {"INC-19"}
    assert not MonetaryFact.objects.exists(), "no payment fabricated"


def test_a_refused_rollback_changes_nothing(db, lead, agent):
    publish(1, grace=grace("P4D"))
    current = publish(2, grace=grace("P7D"))
    make_subscription()
    with pytest.raises(RolloutError) as caught:
        rollout_rollback(cohort="default", by=lead, reason="x", ticket="INC-1", pause_restrictions=True)
    assert caught.value.code == "NO_PERMISSIVE_PREVIOUS"
    with pytest.raises(RolloutError) as caught:
        rollout_rollback(cohort="default", by=agent, reason="x", ticket="INC-1")
    assert caught.value.code == "NOT_A_BILLING_LEAD"
    with pytest.raises(RolloutError) as caught:
        rollout_rollback(cohort="nobody", by=lead, reason="x", ticket="INC-1")
    assert caught.value.code == "EMPTY_COHORT"
    assert set(Subscription.objects.values_list("policy_id", flat=True)) == {current.pk}
    assert not IncidentSwitch.objects.exists() and not TransitionReceipt.objects.filter(edge="rebind_policy").exists()


def test_forward_rebind_is_a_batched_job_with_progress_and_open_cycles_keep_their_policy(db, lead):
    v1 = publish(1)
    subs = [make_subscription() for _ in range(5)]
    cycle = open_cycle(subs[1])
    fail_first_payment(cycle)
    v2 = publish(2, grace=grace("P5D"))
    lines = []
    run = rollout_rebind_forward(cohort="default", to_policy="test-monthly@2", by=lead, reason="ship v2",
                                 ticket="ROLL-2", batch=2, progress=lines.append)
    assert (run.job, run.status, run.examined, run.changed, run.refused) == ("rollout_rebind_forward", "OK", 5, 5, 0)
    assert run.finished_at is not None and "ROLL-2" in run.detail
    assert lines == [f"rollout_rebind_forward: {n} examined, {n} rebound, 0 refused" for n in (2, 4, 5)]
    assert set(Subscription.objects.values_list("policy_id", flat=True)) == {v2.pk}
    assert reload(cycle).policy == v1, "an open cycle keeps the policy it was opened under"
    receipt = TransitionReceipt.objects.get(subscription=subs[1], edge="rebind_policy_forward")
    assert receipt.ticket == "ROLL-2" and "1 open cycle(s) keep test-monthly@1" in receipt.detail
    assert open_cycle(subs[1]).policy == v2, "a new cycle binds to the new version"

    again = rollout_rebind_forward(cohort="default", to_policy=v2, by=lead, reason="re-run", ticket="ROLL-2")
    assert (again.examined, again.changed, again.refused, again.status) == (0, 0, 0, "OK"), "idempotent"
    assert JobRun.objects.filter(job="rollout_rebind_forward").count() == 2
    assert not MonetaryFact.objects.exists()


def test_forward_rebind_is_fenced_against_a_concurrent_change_and_a_rerun_finishes(db, lead, monkeypatch):
    v1 = publish(1)
    first, second, third = (make_subscription() for _ in range(3))
    v2 = publish(2)
    real = rebinding.subscription_accept_change

    def with_a_concurrent_change(**kwargs):
        if kwargs["subscription_pk"] == first.pk:
            # While the job holds a page it read, the second subscription's debt changes.
            fail_first_payment(open_cycle(second))
        return real(**kwargs)

    monkeypatch.setattr(rebinding, "subscription_accept_change", with_a_concurrent_change)
    run = rollout_rebind_forward(cohort="default", to_policy=v2, by=lead, reason="ship v2", ticket="ROLL-3")
    assert (run.status, run.examined, run.changed, run.refused) == ("PARTIAL", 3, 2, 1)
    assert f"subscription {second.pk}: STALE_ROOT" in run.detail
    assert Subscription.objects.get(pk=second.pk).policy == v1, "the stale read overwrote nothing"
    monkeypatch.setattr(rebinding, "subscription_accept_change", real)
    rerun = rollout_rebind_forward(cohort="default", to_policy=v2, by=lead, reason="ship v2", ticket="ROLL-3")
    assert (rerun.examined, rerun.changed, rerun.refused) == (1, 1, 0)
    assert set(Subscription.objects.values_list("policy_id", flat=True)) == {v2.pk}
    assert not RolloutStage.objects.exists()


def test_the_policy_fence_refuses_a_subscription_moved_meanwhile(db, lead):
    v1 = publish(1)
    sub = make_subscription()
    v2 = publish(2)
    result = subscription_accept_change(subscription_pk=sub.pk, change="rebind_policy_forward", policy_pk=v2.pk,
                                        expect_root=sub.outstanding_cycle_root, expect_policy_pk=v1.pk + 999,
                                        cause=Cause.staff(lead, reason="x", ticket="T"))
    assert not result.accepted and result.reason == "POLICY_MOVED"
    assert Subscription.objects.get(pk=sub.pk).policy == v1


def test_forward_rebind_refuses_bad_input_before_anything_runs(db, lead):
    publish(1)
    for kwargs, code in (({"to_policy": "missing@1"}, "UNKNOWN_POLICY"), ({"batch": 0}, "BAD_BATCH"),
                         ({"ticket": ""}, "REASON_AND_TICKET_REQUIRED"), ({"cohort": " "}, "COHORT_REQUIRED")):
        params = {"cohort": "default", "to_policy": "test-monthly@1", "by": lead, "reason": "r", "ticket": "T",
                  **kwargs}
        with pytest.raises(RolloutError) as caught:
            rollout_rebind_forward(**params)
        assert caught.value.code == code
    assert not JobRun.objects.exists()
