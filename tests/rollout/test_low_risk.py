"""The low-risk criterion (issue 19 item 1): stated in the policy, validated with the document,
and applied — a subscription joins a partial rollout only when it is in the bucket AND meets it."""

from __future__ import annotations

import pytest

from dunning.clock import trusted_now
from dunning.models import DunningCycle, FactKind, MonetaryFact
from dunning.policy.cache import policy_spec
from dunning.policy.document import PolicyValidationError, validate_policy
from dunning.policy.rollout import enforces_access, in_rollout, meets_low_risk, rollout_bucket, sends_notifications
from tests.rollout.conftest import publish
from tests.support.builders import make_policy, make_subscription, open_cycle, policy_document

CRITERION = {"min_tenure_days": 30, "max_amount_minor": 5000, "no_disputes": True, "no_conflicts": True}


def test_a_document_without_the_block_keeps_its_canonical_form_and_digest():
    doc = validate_policy(policy_document())
    assert "low_risk" not in doc.canonical["rollout"] and doc.rollout_low_risk is None
    stated = validate_policy(policy_document(rollout={"percent": 5, "cohort": "default", "low_risk": CRITERION}))
    assert stated.canonical["rollout"]["low_risk"] == CRITERION
    assert stated.rollout_low_risk.min_tenure_days == 30 and stated.digest() != doc.digest()


@pytest.mark.parametrize(("low_risk", "message"), [
    ({"min_tenure_days": -1}, "rollout.low_risk.min_tenure_days: must be a whole number, 0 or more, got -1"),
    ({"max_amount_minor": "lots"}, "rollout.low_risk.max_amount_minor: must be a whole number, 0 or more"),
    ({"no_disputes": "yes"}, "rollout.low_risk.no_disputes: must be true or false, got 'yes'"),
    ({"tenure": 3}, "rollout.low_risk.tenure: unknown field"),
    ({}, "rollout.low_risk: is empty"),
    ("everyone", "rollout.low_risk: must be a mapping"),
])
def test_a_malformed_criterion_is_refused_with_one_message(low_risk, message):
    with pytest.raises(PolicyValidationError) as caught:
        validate_policy(policy_document(rollout={"percent": 5, "cohort": "default", "low_risk": low_risk}))
    assert len(caught.value.errors) == 1 and caught.value.errors[0].startswith(message), caught.value.errors


def _subscriptions_in_bucket(percent: int, count: int, *, now=None):
    found = []
    while len(found) < count:
        sub = make_subscription(now=now)
        if rollout_bucket(sub.provider_subscription_id, sub.cohort) < percent:
            found.append(sub)
    return found


def test_only_low_risk_subscriptions_in_the_bucket_join_a_partial_rollout(db, time_machine):
    time_machine.move_to("2026-09-01T09:00:00Z", tick=True)
    policy = make_policy(rollout={"percent": 60, "cohort": "default", "low_risk": CRITERION})
    spec = policy_spec(policy)
    veteran, big_spender, disputed, conflicted = _subscriptions_in_bucket(60, 4)
    outside = next(s for s in iter(make_subscription, None)
                   if rollout_bucket(s.provider_subscription_id, "default") >= 60)
    time_machine.move_to("2026-11-01T09:00:00Z", tick=True)
    newcomer = _subscriptions_in_bucket(60, 1)[0]
    open_cycle(big_spender, amount=9900)
    disputed_cycle = open_cycle(disputed, amount=2500)
    now = trusted_now()
    MonetaryFact.objects.create(kind=FactKind.DISPUTE_OPENED, invoice=disputed_cycle.invoice, amount=2500,
                                currency="usd", dedupe_key="dispute:test", occurred_at=now, recorded_at=now)
    conflict_cycle = open_cycle(conflicted)
    DunningCycle.objects.filter(pk=conflict_cycle.pk).update(state="EVIDENCE_CONFLICT", conflict_reason="two answers")

    def joins(sub):
        return in_rollout(spec, subscription_key=sub.provider_subscription_id, cohort="default",
                          subscription_pk=sub.pk, now=now)

    assert joins(veteran), "in the bucket, 61 days old, small invoices, no dispute, no conflict"
    assert not joins(newcomer), "tenure under 30 days"
    assert not joins(big_spender), "an invoice above 5000"
    assert not joins(disputed), "a dispute fact"
    assert not joins(conflicted), "an evidence conflict"
    assert not joins(outside), "outside the bucket, however low-risk"
    assert meets_low_risk(spec.rollout_low_risk, outside.pk, now), "it meets the criterion: the bucket excludes it"
    assert enforces_access(spec, subscription_key=veteran.provider_subscription_id, cohort="default",
                           subscription_pk=veteran.pk, now=now)
    assert not sends_notifications(spec, subscription_key=newcomer.provider_subscription_id, cohort="default",
                                   subscription_pk=newcomer.pk, now=now)


def test_a_full_rollout_ignores_the_criterion(db):
    policy = publish(1, rollout={"percent": 100, "cohort": "default", "low_risk": CRITERION})
    sub = make_subscription()
    assert enforces_access(policy_spec(policy), subscription_key=sub.provider_subscription_id, cohort="default",
                           subscription_pk=sub.pk), "100 % means everyone, new or not"


def test_without_a_subscription_id_the_criterion_is_not_met(db):
    spec = validate_policy(policy_document(rollout={"percent": 100, "cohort": "default", "low_risk": CRITERION}))
    assert not meets_low_risk(spec.rollout_low_risk, None)
    assert meets_low_risk(None, None), "no criterion: everyone qualifies"
