"""entitlements.profiles: a profile's capabilities are read once, and every caller (a snapshot,
its outbox message) still gets a dict of its own."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from entitlements import profiles
from entitlements.profiles import PROFILES


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_capabilities_are_the_profile_fields_but_name_rank_and_summary(name):
    profile = PROFILES[name]
    expected = {k: v for k, v in asdict(profile).items() if k not in ("name", "rank", "summary")}
    assert profile.capabilities() == expected


def test_each_call_gets_its_own_dict_and_limits(monkeypatch):
    def no_asdict(*_a, **_kw):
        raise AssertionError("capabilities() walked the dataclass again")

    monkeypatch.setattr(profiles, "asdict", no_asdict)  # read once, when the profile was made
    limited = PROFILES[profiles.LIMITED]
    first = limited.capabilities()
    first["read"] = False
    first["limits"]["new_background_jobs_per_day"] = 99
    again = limited.capabilities()
    assert again["read"] is True and again["limits"]["new_background_jobs_per_day"] == 0
    assert limited.limits["new_background_jobs_per_day"] == 0
