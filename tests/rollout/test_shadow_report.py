"""The shadow report (issue 19 item 1): what SHADOW decided, what ENFORCE would have done, what
happened afterwards — and the disagreements."""

from __future__ import annotations

from dunning.rollout.shadow_report import shadow_disagreements, shadow_report
from tests.rollout.conftest import publish
from tests.support.builders import accept, fail_first_payment, make_subscription, open_cycle, paid_evidence, restrict

SHADOW_DOC = {"mode": "SHADOW", "rollout": {"percent": 100, "cohort": "default"}}


def test_a_shadow_restriction_of_a_customer_who_then_paid_is_a_disagreement(db):
    publish(1, **SHADOW_DOC)
    restricted_then_paid, still_in_grace = make_subscription(), make_subscription()
    cycle = open_cycle(restricted_then_paid)
    fail_first_payment(cycle)
    later = restrict(cycle)
    assert accept(cycle, "recover", evidence=paid_evidence(cycle, now=later), now=later)
    fail_first_payment(open_cycle(still_in_grace))

    cases = {c.subscription: c for c in shadow_report()}
    paid = cases[restricted_then_paid.provider_subscription_id]
    assert (paid.mode, paid.shadow_state, paid.access_held, paid.enforce_profile, paid.outcome) == (
        "SHADOW", "RESTRICTED", "FULL", "SUSPENDED", "paid")
    assert paid.disagreement == "ENFORCE would have restricted to SUSPENDED; the customer paid afterwards"
    grace = cases[still_in_grace.provider_subscription_id]
    assert (grace.enforce_profile, grace.outcome, grace.disagreement) == ("READ_EXPORT_NO_NEW_JOBS", "open", "")
    assert [c.subscription for c in shadow_disagreements()] == [restricted_then_paid.provider_subscription_id]


def test_an_enforced_policy_leaves_the_report_empty(db):
    publish(1)  # ENFORCE 100 %
    fail_first_payment(open_cycle(make_subscription()))
    assert shadow_report() == []
