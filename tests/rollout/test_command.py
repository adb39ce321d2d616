"""manage.py rollout status|promote|rollback|rebind|shadow (call_command): tables, progress, and a
clear CommandError that changes nothing on bad input."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from dunning.models import RolloutStage
from subscriptions.models import Subscription
from tests.rollout.conftest import grace, publish
from tests.support.builders import make_subscription

DECISION = ["--by", "lead", "--reason", "seed 001 rollout", "--ticket", "ROLL-7"]


def run(*args: str) -> str:
    out = StringIO()
    call_command("rollout", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def shadow(db, lead, time_machine):
    time_machine.move_to("2026-09-01T09:00:00Z", tick=True)
    policy = publish(1, mode="SHADOW")
    make_subscription()
    return policy


def test_status_prints_mode_percent_and_billing_cycles(shadow, time_machine):
    time_machine.move_to("2026-10-15T09:00:00Z", tick=True)
    text = run("status")
    row = next(line for line in text.splitlines() if line.startswith("test-monthly@1"))
    assert row.split()[:4] == ["test-monthly@1", "default", "SHADOW", "100"] and "1 month(s)" in row
    assert "green" in row
    (data,) = json.loads(run("status", "--json"))
    assert (data["mode"], data["percent"], data["billing_cycles_elapsed"], data["source"]) == (
        "SHADOW", 100, 1, "policy document")


def test_promote_then_status(shadow, time_machine):
    time_machine.move_to("2026-11-02T09:00:00Z", tick=True)
    text = run("promote", "test-monthly@1", "default", "notify_only", "5", *DECISION)
    assert "SHADOW 100 % → NOTIFY_ONLY 5 %" in text
    (data,) = json.loads(run("status", "--json"))
    assert (data["mode"], data["percent"]) == ("NOTIFY_ONLY", 5) and data["source"].startswith("stage #")


@pytest.mark.parametrize(("args", "message"), [
    (["promote", "ghost@1", "default", "NOTIFY_ONLY", "5", *DECISION], "UNKNOWN_POLICY"),
    (["promote", "test-monthly@1", "default", "NOTIFY_ONLY", "250", *DECISION], "PERCENT_OUT_OF_RANGE"),
    (["promote", "test-monthly@1", "default", "ENFORCE", "5", *DECISION], "SKIPS_A_MODE"),
    (["promote", "test-monthly@1", "default", "NOTIFY_ONLY", "5", *DECISION], "SHADOW_WINDOW_NOT_MET"),
    (["promote", "test-monthly@1", "default", "NOTIFY_ONLY", "5", "--by", "nobody", "--reason", "r", "--ticket",
      "T"], "no such user"),
    (["promote", "test-monthly@1", "default", "NOTIFY_ONLY", "5", *DECISION, "--now", "tomorrow"],
     "not an ISO 8601"),
    (["rollback", "default", *DECISION], "NO_PERMISSIVE_PREVIOUS"),
    (["rebind", "default", "ghost@2", *DECISION], "UNKNOWN_POLICY"),
])
def test_bad_input_is_a_command_error_and_changes_nothing(shadow, args, message):
    with pytest.raises(CommandError, match=message):
        run(*args)
    assert not RolloutStage.objects.exists()
    assert set(Subscription.objects.values_list("policy_id", flat=True)) == {shadow.pk}


def test_rebind_prints_progress_and_rollback_goes_back(shadow):
    for _ in range(2):
        make_subscription()
    v2 = publish(2, mode="SHADOW", grace=grace("P5D"))
    text = run("rebind", "default", "test-monthly@2", "--batch", "2", *DECISION)
    assert "rollout_rebind_forward: 2 examined, 2 rebound, 0 refused" in text
    assert "rollout_rebind_forward: 3 examined, 3 rebound, 0 refused" in text and "OK: 3 examined" in text
    assert set(Subscription.objects.values_list("policy_id", flat=True)) == {v2.pk}
    text = run("rollback", "default", "--pause-restrictions", *DECISION)
    assert "test-monthly@2 → test-monthly@1: 3 rebound, 0 refused" in text and "new restrictions paused" in text
    assert set(Subscription.objects.values_list("policy_id", flat=True)) == {shadow.pk}
    assert "0 disagreement(s)" in run("shadow")
