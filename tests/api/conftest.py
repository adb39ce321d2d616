"""Actors and clients for the API tests: a support agent, a billing lead, a customer, a staff
member without a role, and service tokens (optionally restricted)."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from rest_framework.test import APIClient

from entitlements.api.tokens import service_token_create
from tests.support.actors import AGENTS, LEADS, bearer_client, make_staff, make_user, session_client
from tests.support.builders import fail_first_payment, local_policy, make_subscription, open_cycle

RELAXED_RATES = {"entitlement_read": "100000/min", "billing_read": "100000/min", "billing_write": "100000/min",
                 "usage_write": "100000/min"}


@pytest.fixture(autouse=True)
def relaxed_throttles(settings):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": RELAXED_RATES}
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def agent(db):
    return make_staff("agent", AGENTS)


@pytest.fixture
def lead(db):
    return make_staff("lead", LEADS)


@pytest.fixture
def roleless_staff(db):
    return make_staff("intern")


@pytest.fixture
def customer_user(db):
    return make_user("payer")


@pytest.fixture
def agent_client(agent):
    return session_client(agent)


@pytest.fixture
def lead_client(lead):
    return session_client(lead)


@pytest.fixture
def token_client(db):
    """`token_client(scopes=..., provider_account=..., cohort=...)` → an APIClient with a Bearer token."""
    made = []

    def make(*, scopes=("entitlements:read",), provider_account: str = "", cohort: str = "") -> APIClient:
        _, raw = service_token_create(name=f"svc-{len(made)}", scopes=scopes, provider_account=provider_account,
                                      cohort=cohort)
        client = bearer_client(raw)
        made.append(client)
        return client

    return make


@pytest.fixture
def subscription(policy):
    return make_subscription()


@pytest.fixture
def grace_cycle(subscription):
    """A cycle in GRACE_ACTIVE: the first renewal charge failed."""
    cycle = open_cycle(subscription)
    fail_first_payment(cycle)
    return cycle


@pytest.fixture
def local_policy_cycle(db):
    """GRACE_ACTIVE under a LOCAL-retry policy (so retry-now is allowed to try)."""
    local_policy()
    sub = make_subscription(price="price_local")
    cycle = open_cycle(sub)
    fail_first_payment(cycle)
    return cycle

