"""Two identical usage posts at the same moment, on two PostgreSQL sessions: one row, both
answered with it (one 201, one 200 replay). Transactional tests: each thread commits for real."""

from __future__ import annotations

import json

import pytest
from django.core.cache import cache
from django.test import Client

from dunning.policy.publishing import policy_publish
from entitlements.api.tokens import service_token_create
from subscriptions.models import UsageRecord
from subscriptions.usage import UsageConflict, usage_record
from tests.support.builders import make_subscription, policy_document
from tests.support.threads import run_together
from tests.usage.conftest import usage

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def scene():
    policy_publish(text=json.dumps(policy_document()))
    token, raw = service_token_create(name="race-meter", scopes=("usage:write",))
    return make_subscription(), token, raw


def test_two_identical_posts_at_once_make_one_row(scene):
    sub, _, raw = scene
    cache.clear()
    payload = {"producer_record_id": "race-1", "subscription": sub.provider_subscription_id, "metric": "calls",
               "quantity": 7, "cost": 70, "currency": "usd", "occurred_at": "2026-02-01T00:00:00Z"}

    def post():
        response = Client().post("/api/v1/usage-records/", payload, content_type="application/json",
                                 HTTP_AUTHORIZATION=f"Bearer {raw}")
        return response.status_code, response.json()

    for round_ in range(3):  # a few rounds, so the insert race is run more than once
        payload["producer_record_id"] = f"race-{round_}"
        (status_a, a), (status_b, b) = run_together([post, post])
        assert sorted([status_a, status_b]) == [200, 201], (a, b)
        assert a["id"] == b["id"]
    assert UsageRecord.objects.count() == 3


def test_a_conflicting_post_racing_the_first_leaves_the_winner_intact(scene):
    sub, token, _ = scene
    at = usage().occurred_at
    outcomes = run_together([lambda: usage_record(subscription=sub, producer=token, usage=usage("x", occurred_at=at)),
                             lambda: usage_record(subscription=sub, producer=token,
                                                  usage=usage("x", quantity=5, occurred_at=at))],
                            errors="return")
    conflicts = [o for o in outcomes if isinstance(o, UsageConflict)]
    stored = [o for o in outcomes if not isinstance(o, Exception)]
    assert len(conflicts) == 1 and len(stored) == 1, outcomes
    assert list(UsageRecord.objects.values_list("quantity", flat=True)) == [stored[0].record.quantity]
