"""Incident switch (SPEC §11, §15): pause new restrictions, roll a cohort back to the previous
policy version, leave with a new generation; never fabricate a payment."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from dunning.acceptance.inputs import Expect
from dunning.actions.incidents import (
    IncidentError,
    cohort_rebind_to_previous,
    incident_end,
    incident_start,
)
from dunning.jobs.framework import job_run
from dunning.models import MonetaryFact
from dunning.models import TransitionReceipt as Receipt
from dunning.policy.publishing import policy_publish
from dunning.policy.rollout import enforces_access, rollout_bucket
from entitlements.models import EntitlementSnapshot
from tests.support.builders import accept, reload
from tests.support.scenarios import cycle_of, failed_renewal


@pytest.fixture
def lead(django_user_model):
    return django_user_model.objects.create_user("lead", password="x", is_staff=True)


@pytest.fixture
def expired_unpaid(sim, time_machine):
    time_machine.move_to("2026-12-01T09:00:00Z", tick=True)
    _, invoice_id, cycle = failed_renewal(sim)
    time_machine.move_to(cycle.grace_expires_at + timedelta(minutes=1), tick=True)
    return invoice_id


def test_incident_pauses_restriction_and_leaving_it_issues_a_new_generation(expired_unpaid, lead):
    incident = incident_start(user=lead, reason="provider outage: payments not reaching us", ticket="INC-7")
    run = job_run("grace_expiry")
    cycle = cycle_of(expired_unpaid)
    assert cycle.state == "GRACE_EXPIRED" and run.refused == 1 and "INC-7" in run.detail
    assert cycle.subscription.entitlement_profile == "READ_EXPORT_NO_NEW_JOBS", "access not reduced"
    generation = cycle.subscription.entitlement_generation

    outcome = incident_end(switch=incident, user=lead)
    assert outcome.changed >= 1 and not outcome.refused
    sub = cycle_of(expired_unpaid).subscription
    assert sub.entitlement_generation == generation + 1
    latest = EntitlementSnapshot.objects.filter(subscription=sub).latest("generation")
    assert (latest.generation, latest.profile) == (generation + 1, "READ_EXPORT_NO_NEW_JOBS")
    assert not MonetaryFact.objects.filter(kind="PAYMENT_SUCCEEDED", invoice=cycle.invoice).exists(), \
        "no payment fabricated"

    job_run("restriction")
    assert cycle_of(expired_unpaid).state == "RESTRICTED", "restrictions resume after the incident"


def test_the_acceptance_service_itself_refuses_restriction_during_an_incident(expired_unpaid, lead):
    from tests.support.builders import unpaid_evidence

    cycle = cycle_of(expired_unpaid)
    assert accept(cycle, "expire_grace").accepted
    incident_start(user=lead, reason="bad deploy", ticket="INC-8", cohort="default")
    refused = accept(cycle, "begin_restriction", evidence=unpaid_evidence(cycle))
    assert not refused.accepted and refused.reason == "RESTRICTIONS_PAUSED"


def test_an_incident_needs_a_reason_and_ticket(db, lead):
    with pytest.raises(IncidentError, match="reason and a ticket"):
        incident_start(user=lead, reason="", ticket="INC-1")


def test_rebinding_a_cohort_to_the_previous_policy_version(sim, lead, time_machine):
    time_machine.move_to("2026-12-01T09:00:00Z", tick=True)
    doc = yaml.safe_load(Path("dunning/policy/shipped/standard-monthly.yaml").read_text())
    doc["policy"] = "standard-monthly@7"
    doc["grace"]["duration"] = "P4D"  # the stricter release that caused the incident
    newer, _ = policy_publish(text=json.dumps(doc))
    _, invoice_id, cycle = failed_renewal(sim)
    assert cycle.policy == newer and cycle.subscription.policy == newer
    stale = Expect.from_cycle(cycle)

    outcome = cohort_rebind_to_previous(policy=newer, cohort="default", user=lead, reason="grace too short",
                                        ticket="INC-9")
    assert outcome.changed >= 1
    cycle = cycle_of(invoice_id)
    assert cycle.policy.identity == "standard-monthly@6" and cycle.subscription.policy.identity == "standard-monthly@6"
    refused = accept(cycle, "expire_grace", expect=stale, now=cycle.grace_expires_at + timedelta(days=5))
    assert not refused.accepted and refused.reason in ("STALE_CYCLE_GENERATION", "POLICY_MISMATCH")
    receipt = Receipt.objects.filter(subscription=cycle.subscription, edge="rebind_policy").get()
    assert receipt.ticket == "INC-9" and "standard-monthly@7" in receipt.detail
    assert cycle.state == "GRACE_ACTIVE"
    assert not MonetaryFact.objects.filter(kind="PAYMENT_SUCCEEDED", invoice=cycle.invoice).exists()


def test_rollback_without_a_previous_version_is_refused(shipped_policies, lead):
    with pytest.raises(IncidentError, match="no previous version"):
        cohort_rebind_to_previous(policy=shipped_policies["standard-monthly"], cohort="default", user=lead,
                                  reason="x", ticket="INC-1")


def test_rollout_percentage_is_deterministic_per_subscription(db):
    from dunning.policy.cache import policy_spec
    from tests.support.builders import make_policy

    spec = policy_spec(make_policy(policy="half@1", rollout={"percent": 50, "cohort": "default"},
                                   applies_to={"prices": ["price_half"], "cohort": "default"}))
    keys = [f"sub_{n}" for n in range(400)]
    chosen = [k for k in keys if enforces_access(spec, subscription_key=k, cohort="default")]
    assert chosen == [k for k in keys if enforces_access(spec, subscription_key=k, cohort="default")]
    assert 150 < len(chosen) < 250
    assert all(rollout_bucket(k, "default") < 50 for k in chosen)
    assert not enforces_access(spec, subscription_key=chosen[0], cohort="other"), "outside the cohort"


def test_shadow_subscription_outside_rollout_keeps_access(db):
    from tests.support.builders import fail_first_payment, make_policy, make_subscription, open_cycle

    make_policy(policy="half@1", rollout={"percent": 50, "cohort": "default"},
                applies_to={"prices": ["price_half"], "cohort": "default"})
    results = {}
    for _ in range(12):
        sub = make_subscription(price="price_half")
        cycle = open_cycle(sub)
        fail_first_payment(cycle)
        results[sub.provider_subscription_id] = reload(cycle).subscription.entitlement_profile
    for key, profile in results.items():
        expected = "READ_EXPORT_NO_NEW_JOBS" if rollout_bucket(key, "default") < 50 else "FULL"
        assert profile == expected, key
    assert set(results.values()) == {"FULL", "READ_EXPORT_NO_NEW_JOBS"}
