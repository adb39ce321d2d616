"""Hostile input on the operations pages issue 19 added (rollout, compensation, sample verdicts):
NUL bytes, oversize text, wrong types and unknown ids are a clear 4xx, never a 500, and change
nothing."""

from __future__ import annotations

import pytest
from django.urls import reverse

from dunning.models import JobRun, RolloutStage
from dunning.models.duties import CompensationAction, SampleVerdict
from tests.duties.conftest import PASSWORD, open_case

NUL = "a\x00b"
HUGE_ID = 10**30


@pytest.fixture
def lead_client(client, lead):
    client.login(username=lead.username, password=PASSWORD)
    return client


ROLLOUT_POSTS = [
    ("admin:dunning_rollout_promote", {"promote-policy": NUL, "promote-cohort": "default", "promote-mode": "ENFORCE",
                                        "promote-percent": "5", "promote-reason": "r", "promote-ticket": "t"}),
    ("admin:dunning_rollout_promote", {"promote-policy": "x" * 5000, "promote-cohort": "default",
                                        "promote-mode": "ENFORCE", "promote-percent": "1e9", "promote-reason": "r",
                                        "promote-ticket": "t"}),
    ("admin:dunning_rollout_promote", {"promote-policy": "p@1", "promote-cohort": "default", "promote-mode": "NOPE",
                                        "promote-percent": "[]", "promote-reason": NUL, "promote-ticket": "t"}),
    ("admin:dunning_rollout_rollback", {"rollback-cohort": NUL, "rollback-reason": "r", "rollback-ticket": "t"}),
    ("admin:dunning_rollout_rebind", {"rebind-cohort": "default", "rebind-policy": str(HUGE_ID),
                                       "rebind-reason": "r", "rebind-ticket": "t"}),
    ("admin:dunning_rollout_rebind", {"rebind-cohort": "default", "rebind-policy": NUL, "rebind-reason": "r",
                                       "rebind-ticket": "x" * 5000}),
]


@pytest.mark.parametrize(("url", "data"), ROLLOUT_POSTS)
def test_rollout_forms_refuse_hostile_input_with_a_4xx(lead_client, url, data):
    answer = lead_client.post(reverse(url), data)
    assert 400 <= answer.status_code < 500, answer.status_code
    assert not RolloutStage.objects.exists() and not JobRun.objects.exists()


@pytest.mark.parametrize("data", [
    {"resolution": NUL, "reason": "r", "ticket": "t"},
    {"resolution": "EXPLAINED", "reason": NUL, "ticket": "t"},
    {"resolution": "EXPLAINED", "reason": "r", "ticket": "x" * 5000},
    {"resolution": "GRANT_EXCEPTION", "reason": "r", "ticket": "t", "exception_expires_at": "not a date"},
])
def test_compensation_forms_refuse_hostile_input_with_a_4xx(lead_client, grace_scene, data):
    case = open_case(grace_scene)
    actions = CompensationAction.objects.count()
    for name in ("admin:dunning_compensationcase_take", "admin:dunning_compensationcase_resolve"):
        answer = lead_client.post(reverse(name, args=[case.pk]), {k: v for k, v in data.items()})
        assert answer.status_code < 500, (name, answer.status_code)
    assert CompensationAction.objects.count() == actions + 1  # the take; no resolution
    case.refresh_from_db()
    assert case.state != "RESOLVED"


@pytest.mark.parametrize("name", ["admin:dunning_compensationcase_take", "admin:dunning_compensationcase_resolve",
                                  "admin:dunning_samplereviewitem_verdict"])
def test_unknown_ids_are_a_4xx(lead_client, name):
    answer = lead_client.post(reverse(name, args=[HUGE_ID]), {"reason": "r", "ticket": "t", "verdict": "CORRECT"})
    assert 400 <= answer.status_code < 500, answer.status_code
    assert not SampleVerdict.objects.exists()
