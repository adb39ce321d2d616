"""Actors and scenes of seed 003's duties: billing leads (`lead`, `lead2`) work the queue and the
sample review; a support agent (`agent`) may do neither. Scenes are built through the acceptance
service only (tests/support/builders.py)."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module

import pytest
from django.apps import apps

from dunning.actions.compensation import compensation_open
from dunning.clock import trusted_now
from dunning.models import DunningCycle
from dunning.models.duties import CompensationCase, CompensationKind
from subscriptions.models import Subscription
from tests.console.conftest import provider_says  # noqa: F401  (the fixture: fresh fetches show one status)
from tests.support.actors import AGENTS, LEADS, make_staff, staff_roles_from_migration
from tests.support.builders import fail_first_payment, make_subscription, open_cycle, reload

PASSWORD = "correct horse battery staple"
DUTIES_MIGRATION = "dunning.migrations.0013_duties_compensation_and_sample_review"


@pytest.fixture
def roles(db):
    staff_roles_from_migration()
    import_module(DUTIES_MIGRATION).grant_to_billing_leads(apps, None)


def _staff(username: str, group: str):  # noqa: ANN202
    return make_staff(username, group, password=PASSWORD, email=f"{username}@example.com")


@pytest.fixture
def lead(roles):
    return _staff("lead", LEADS)


@pytest.fixture
def lead2(roles):
    return _staff("lead2", LEADS)


@pytest.fixture
def agent(roles):
    return _staff("agent", AGENTS)


@dataclass
class Scene:
    sub: Subscription
    cycle: DunningCycle

    def fresh(self) -> Scene:
        return Scene(Subscription.objects.get(pk=self.sub.pk), reload(self.cycle))


@pytest.fixture
def grace_scene(policy) -> Scene:
    """A renewal failed: grace, READ_EXPORT_NO_NEW_JOBS."""
    sub = make_subscription(email="ada@example.com")
    cycle = open_cycle(sub, amount=4900)
    fail_first_payment(cycle)
    return Scene(sub, cycle).fresh()


def open_case(scene: Scene, kind: str = CompensationKind.PAID_NOT_ENTITLED) -> CompensationCase:
    case, opened = compensation_open(kind=kind, subscription=scene.sub, invoice=scene.cycle.invoice,
                                     detail=f"test: {kind}", now=trusted_now())
    assert opened
    return case
