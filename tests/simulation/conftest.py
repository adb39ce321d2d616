import pytest

from tests.verification.simulation import Schedule, Simulation


@pytest.fixture
def world(db):
    """A scripted simulation: ``with world("standard", "local") as w: ...`` (one plan per subscription);
    ``retries="smart-14d"`` gives the provider an 8-try, 14-day retry schedule (schedule.PROVIDER_RETRIES)."""

    def make(*plans: str, retries: str = "stripe-default"):
        return Simulation(Schedule(seed=0, plans=plans or ("standard",), provider_retries=retries)).session()

    return make
