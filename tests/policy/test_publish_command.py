import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from dunning.models import DunningPolicy
from dunning.policy.publishing import NoPolicyError, policy_for_price
from tests.support.builders import make_policy, make_subscription, policy_document

SHIPPED = sorted(str(p) for p in Path("dunning/policy/shipped").glob("*.yaml"))


def test_shipped_policies_publish_once_and_bind_by_price(db, capsys):
    assert len(SHIPPED) == 5
    call_command("publish_policy", *SHIPPED)
    call_command("publish_policy", *SHIPPED)
    out = capsys.readouterr().out
    assert out.count("already published (same content)") == 5
    assert DunningPolicy.objects.count() == 5
    stripe = {"provider": "stripe", "account": "acct_demo"}
    assert policy_for_price("price_monthly_pro", **stripe).identity == "standard-monthly@6"
    assert policy_for_price("plan_annual_legacy", **stripe).identity == "annual-no-grace@1"
    assert policy_for_price("price_monthly_local", **stripe).spec.retry_authority == "LOCAL"
    assert policy_for_price("price_nobody_wrote_a_policy_for", **stripe).identity == "default-catch-all@1"
    assert policy_for_price("price_annual_pro", **stripe).spec.has_grace is False
    # The Alipay default catches Alipay prices only; Stripe's catch-all never binds an Alipay price.
    alipay = {"provider": "alipay", "account": "2021000000000001"}
    assert policy_for_price("alipay_monthly", **alipay).identity == "alipay-monthly@1"
    assert policy_for_price("price_monthly_pro", **alipay).identity == "alipay-monthly@1"
    assert policy_for_price("alipay_monthly", **stripe).identity == "default-catch-all@1"


# Digests of the shipped Stripe policies as published before issue 20: a bound policy's document
# never changes, so these files are never edited (publish name@version+1 instead).
SHIPPED_DIGESTS = {
    "standard-monthly@6": "cf3eb2ea2bd8", "annual-no-grace@1": "e74c3b09c367",
    "local-retry-monthly@1": "07c44b2224c7", "default-catch-all@1": "87517c504750",
}


def test_shipped_stripe_policies_keep_their_digests(db):
    call_command("publish_policy", *SHIPPED)
    for identity, digest in SHIPPED_DIGESTS.items():
        assert DunningPolicy.objects.get(identity=identity).digest.startswith(digest), identity


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
    assert policy_for_price("price_test", provider="stripe").identity == "test-monthly@2"
    sub.refresh_from_db()
    assert sub.policy.identity == "test-monthly@1"  # bound policies never change under a subscription


def test_no_policy_at_all_is_a_clear_error(db):
    with pytest.raises(NoPolicyError, match="no policy is published for provider 'stripe'"):
        policy_for_price("price_x", provider="stripe")


def test_no_default_policy_is_a_clear_error(db):
    make_policy(policy="only-listed@1")
    with pytest.raises(NoPolicyError, match="no default policy for 'stripe'"):
        policy_for_price("price_x", provider="stripe")


def test_missing_file_is_reported(db, capsys):
    with pytest.raises(CommandError):
        call_command("publish_policy", "does/not/exist.yaml")
    assert "cannot read" in capsys.readouterr().err
