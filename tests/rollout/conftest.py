"""Actors and policies of the rollout tests: a billing lead, a support agent, and helpers that
publish versions of the test policy through the publishing service."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dunning.models import DunningPolicy
from dunning.policy.publishing import policy_publish
from tests.support.actors import AGENTS, LEADS, make_staff, staff_roles_from_migration
from tests.support.builders import policy_document

PASSWORD = "correct horse battery staple"


@pytest.fixture
def roles(db):
    staff_roles_from_migration()


@pytest.fixture
def lead(roles):
    return make_staff("lead", LEADS, password=PASSWORD, email="lead@example.com")


@pytest.fixture
def agent(roles):
    return make_staff("agent", AGENTS, password=PASSWORD, email="agent@example.com")


def publish(version: int, *, name: str = "test-monthly", **overrides: Any) -> DunningPolicy:
    doc = policy_document(policy=f"{name}@{version}", **overrides)
    policy, _ = policy_publish(text=json.dumps(doc))
    return policy


def grace(duration: str) -> dict[str, str]:
    return {"starts": "FIRST_FAILURE", "duration": duration, "profile": "READ_EXPORT_NO_NEW_JOBS"}
