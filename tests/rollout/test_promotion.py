"""Promotion (issue 19 item 1): the live stage is its own append-only record; a promotion is
refused — with a code, changing nothing — for an unknown policy, a percent out of range, a skipped
mode, a shadow window not yet run, red gates, or someone who is not a billing lead."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from dunning.clock import trusted_now
from dunning.models import FactKind, MonetaryFact, RolloutStage, TransitionReceipt
from dunning.policy.cache import policy_spec
from dunning.policy.rollout import effective_stage, enforces_access, sends_notifications
from dunning.rollout.errors import RolloutError
from dunning.rollout.promotion import rollout_promote
from dunning.rollout.status import elapsed_periods, rollout_status
from entitlements.models import EntitlementSnapshot
from tests.rollout.conftest import publish
from tests.support.builders import fail_first_payment, make_subscription, open_cycle, reload

SHADOW_DOC = {"mode": "SHADOW", "rollout": {"percent": 100, "cohort": "default"}}


@pytest.fixture
def shadow_policy(db, time_machine):
    time_machine.move_to("2026-09-01T09:00:00Z", tick=True)
    return publish(1, **SHADOW_DOC)


def promote(policy, lead, mode="NOTIFY_ONLY", percent=5, **kw):
    return rollout_promote(policy=kw.pop("as_given", policy.identity), cohort=kw.pop("cohort", "default"),
                           to_mode=mode, percent=percent, by=kw.pop("by", lead), reason=kw.pop("reason", "seed 001"),
                           ticket=kw.pop("ticket", "ROLL-1"), **kw)


@pytest.mark.parametrize(("kwargs", "code"), [
    ({"as_given": "nope@9"}, "UNKNOWN_POLICY"),
    ({"percent": 101}, "PERCENT_OUT_OF_RANGE"),
    ({"percent": -1}, "PERCENT_OUT_OF_RANGE"),
    ({"percent": "five"}, "PERCENT_OUT_OF_RANGE"),
    ({"percent": 2.5}, "PERCENT_OUT_OF_RANGE"),
    ({"mode": "LOUD"}, "UNKNOWN_MODE"),
    ({"mode": "ENFORCE"}, "SKIPS_A_MODE"),
    ({"ticket": " "}, "REASON_AND_TICKET_REQUIRED"),
    ({"cohort": ""}, "COHORT_REQUIRED"),
])
def test_a_bad_promotion_is_refused_with_a_code_and_changes_nothing(shadow_policy, lead, time_machine, kwargs,
                                                                    code):
    time_machine.move_to("2026-11-02T09:00:00Z", tick=True)  # the window has run: only the fault refuses
    with pytest.raises(RolloutError) as caught:
        promote(shadow_policy, lead, **kwargs)
    assert caught.value.code == code, caught.value
    assert not RolloutStage.objects.exists()
    assert effective_stage(policy_spec(shadow_policy), "default").mode == "SHADOW"


def test_only_a_billing_lead_may_promote(shadow_policy, agent, time_machine):
    time_machine.move_to("2026-11-02T09:00:00Z", tick=True)
    with pytest.raises(RolloutError) as caught:
        promote(shadow_policy, agent, by=agent)
    assert caught.value.code == "NOT_A_BILLING_LEAD" and not RolloutStage.objects.exists()


def test_leaving_shadow_waits_for_two_billing_cycles(shadow_policy, lead, time_machine):
    time_machine.move_to("2026-10-25T09:00:00Z", tick=True)  # one month and some days
    with pytest.raises(RolloutError) as caught:
        promote(shadow_policy, lead)
    assert caught.value.code == "SHADOW_WINDOW_NOT_MET" and "1 of 2 billing cycles" in str(caught.value)
    assert not RolloutStage.objects.exists()
    time_machine.move_to("2026-11-01T09:00:01Z", tick=True)
    stage = promote(shadow_policy, lead)
    assert (stage.previous_mode, stage.mode, stage.percent) == ("SHADOW", "NOTIFY_ONLY", 5)
    assert stage.evidence["gates"]["passed"] is True and stage.evidence["window"]["periods_elapsed"] == 2
    assert effective_stage(policy_spec(shadow_policy), "default").mode == "NOTIFY_ONLY"


def test_red_gates_refuse_a_promotion(shadow_policy, lead, time_machine):
    sub = make_subscription()
    cycle = open_cycle(sub)
    now = trusted_now()
    for ref in ("ch_1", "ch_2"):  # two different successful charges for one invoice: the gate goes red
        MonetaryFact.objects.create(kind=FactKind.PAYMENT_SUCCEEDED, invoice=cycle.invoice, amount=2500,
                                    currency="usd", provider_ref=ref, dedupe_key=f"paid:{ref}", occurred_at=now,
                                    recorded_at=now)
    time_machine.move_to("2026-11-02T09:00:00Z", tick=True)
    with pytest.raises(RolloutError) as caught:
        promote(shadow_policy, lead)
    assert caught.value.code == "GATES_RED" and "duplicate_charges" in str(caught.value)
    assert not RolloutStage.objects.exists()


def test_the_stage_not_the_document_decides_enforcement(db, lead, time_machine):
    time_machine.move_to("2026-09-01T09:00:00Z", tick=True)
    policy = publish(1)  # the document says ENFORCE 100 %
    sub = make_subscription()
    spec = policy_spec(policy)
    key = {"subscription_key": sub.provider_subscription_id, "cohort": "default", "subscription_pk": sub.pk}
    assert enforces_access(spec, **key)
    promote(policy, lead, mode="SHADOW", percent=100)  # a step back needs no window and no gates
    assert not enforces_access(spec, **key) and not sends_notifications(spec, **key)
    cycle = open_cycle(sub)
    fail_first_payment(cycle)
    receipt = TransitionReceipt.objects.filter(cycle=cycle, edge="start_grace").get()
    assert receipt.decision_profile == "READ_EXPORT_NO_NEW_JOBS" and "mode SHADOW: decision recorded" in receipt.detail
    assert reload(cycle).subscription.entitlement_profile == "FULL", "SHADOW leaves access alone"
    assert EntitlementSnapshot.objects.filter(subscription=sub).count() == 1, "only the first snapshot"
    with pytest.raises(RolloutError) as caught:
        promote(policy, lead, mode="SHADOW", percent=100)
    assert caught.value.code == "NO_CHANGE"


def test_status_shows_mode_percent_and_billing_cycles_run(shadow_policy, lead, time_machine):
    sub = make_subscription()
    open_cycle(sub)
    time_machine.move_to("2026-11-15T09:00:00Z", tick=True)
    promote(shadow_policy, lead, percent=5)
    time_machine.move_to("2027-01-16T10:00:00Z", tick=True)
    (row,) = rollout_status()
    assert (row.policy, row.cohort, row.mode, row.percent) == ("test-monthly@1", "default", "NOTIFY_ONLY", 5)
    assert row.periods_elapsed == 2 and row.interval == "month" and row.source.startswith("stage #")
    assert row.cycles_opened == 0, "the cycle was opened before this stage began"
    assert row.gates_passed is True and row.subscriptions == 1


def test_elapsed_periods_are_whole_calendar_periods():
    start = datetime(2026, 1, 31, 12, tzinfo=UTC)
    assert elapsed_periods(start, datetime(2026, 3, 30, 12, tzinfo=UTC), "month") == 1
    assert elapsed_periods(start, datetime(2026, 3, 31, 12, tzinfo=UTC), "month") == 2
    assert elapsed_periods(start, datetime(2028, 1, 31, 11, tzinfo=UTC), "year") == 1
