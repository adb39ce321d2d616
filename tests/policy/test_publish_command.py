import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from dunning.models import DunningPolicy
from dunning.policy.publishing import NoPolicyError, policy_for_price
from tests.support.builders import make_subscription, policy_document

SHIPPED = sorted(str(p) for p in Path("dunning/policy/shipped").glob("*.yaml"))


def test_shipped_policies_publish_once_and_bind_by_price(db, capsys):
    assert len(SHIPPED) == 4
    call_command("publish_policy", *SHIPPED)
    call_command("publish_policy", *SHIPPED)
    out = capsys.readouterr().out
    assert out.count("already published (same content)") == 4
    assert DunningPolicy.objects.count() == 4
    assert policy_for_price("price_monthly_pro").identity == "standard-monthly@6"
    assert policy_for_price("plan_annual_legacy").identity == "annual-no-grace@1"
    assert policy_for_price("price_monthly_local").spec.retry_authority == "LOCAL"
    assert policy_for_price("price_nobody_wrote_a_policy_for").identity == "default-catch-all@1"
    assert policy_for_price("price_annual_pro").spec.has_grace is False


def test_invalid_policy_reports_each_fault_and_publishes_nothing(db, tmp_path, capsys):
    bad = policy_document(retryAuthority=["PAYMENT_PROVIDER", "LOCAL"], colour="blue")
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(CommandError, match="1 of 1"):
        call_command("publish_policy", str(path))
    err = capsys.readouterr().err
    assert "colour" in err and "retry" in err.lower()
    assert DunningPolicy.objects.count() == 0


def test_changed_document_under_same_identity_is_refused(db, tmp_path, capsys):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(policy_document()))
    call_command("publish_policy", str(path))
    path.write_text(json.dumps(policy_document(maxAttempts=3)))
    with pytest.raises(CommandError):
        call_command("publish_policy", str(path))
    assert "publish a new version" in capsys.readouterr().err


def test_newest_matching_policy_wins_and_binding_is_kept(db, tmp_path):
    first = tmp_path / "v1.json"
    first.write_text(json.dumps(policy_document()))
    call_command("publish_policy", str(first))
    sub = make_subscription()
    second = tmp_path / "v2.json"
    second.write_text(json.dumps(policy_document(policy="test-monthly@2")))
    call_command("publish_policy", str(second))
    assert policy_for_price("price_test").identity == "test-monthly@2"
    sub.refresh_from_db()
    assert sub.policy.identity == "test-monthly@1"  # bound policies never change under a subscription


def test_no_policy_at_all_is_a_clear_error(db):
    with pytest.raises(NoPolicyError, match="no default policy"):
        policy_for_price("price_x")


def test_missing_file_is_reported(db, capsys):
    with pytest.raises(CommandError):
        call_command("publish_policy", "does/not/exist.yaml")
    assert "cannot read" in capsys.readouterr().err
