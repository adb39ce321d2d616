import pytest

from dunning.simulation import Schedule, Simulation


@pytest.fixture
def world(db):
    """A scripted simulation: ``with world("standard", "local") as w: ...`` (one plan per subscription)."""

    def make(*plans: str):
        return Simulation(Schedule(seed=0, plans=plans or ("standard",))).session()

    return make
