"""Scenes of the usage tests: a producer's service token, subscriptions in any entitlement profile
(reached through the acceptance service, never by writing the profile), and a record builder."""

from __future__ import annotations

from datetime import timedelta

import pytest

from dunning.clock import trusted_now
from entitlements.api.tokens import service_token_create
from entitlements.profiles import FULL
from subscriptions.models import Subscription
from subscriptions.usage import UsageInput
from tests.api.conftest import relaxed_throttles  # noqa: F401  (autouse: the API tests' relaxed rates)
from tests.support.actors import bearer_client
from tests.support.builders import fail_first_payment, make_policy, make_subscription, open_cycle, restrict


@pytest.fixture
def producer(db):
    token, raw = service_token_create(name="inference-meter", scopes=("usage:write",))
    token.raw = raw
    return token


@pytest.fixture
def producer_client(producer):
    return bearer_client(producer.raw)


@pytest.fixture
def reader_client(db):
    _, raw = service_token_create(name="billing-reader", scopes=("billing:read",))
    return bearer_client(raw)


def usage(record_id: str = "run-1", **overrides) -> UsageInput:
    fields = {"producer_record_id": record_id, "metric": "tokens", "quantity": 1200, "cost": 36, "currency": "usd",
              "occurred_at": trusted_now() - timedelta(minutes=5)}
    fields.update(overrides)
    return UsageInput(**fields)


def subscription_in_profile(profile: str) -> Subscription:
    """A subscription whose entitlement profile is `profile`: FULL with no debt; any other by a failed
    renewal restricted to that profile under its own policy."""
    if profile == FULL:
        make_policy()
        return make_subscription()
    grace = {"starts": "FIRST_FAILURE", "duration": "P7D", "profile": "LIMITED"}  # never looser than restricted
    slug = profile.lower().replace("_", "-")
    make_policy(policy=f"usage-{slug}@1", restricted_profile=profile, grace=grace,
                applies_to={"prices": [f"price_{profile.lower()}"], "cohort": "default"})
    sub = make_subscription(price=f"price_{profile.lower()}")
    cycle = open_cycle(sub, amount=4900)
    fail_first_payment(cycle)
    restrict(cycle)
    sub = Subscription.objects.get(pk=sub.pk)
    assert sub.entitlement_profile == profile, sub.entitlement_profile
    return sub


@pytest.fixture
def revoked_subscription(db):
    return subscription_in_profile("REVOKED")
