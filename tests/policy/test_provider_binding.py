"""Binding is provider-aware (issue 20): a policy's `provider.name` must be the subscription's
provider, and a policy stating the subscription's provider account wins over one of another
account. Rebinding (support, rollback, forward) stays within the subscription's provider."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dunning.acceptance.inputs import Cause
from dunning.acceptance.opening import InvoiceFacts, OpeningRefused, cycle_open_for_invoice
from dunning.acceptance.subscription import subscription_accept_change
from dunning.actions.incidents import IncidentError, previous_policy_version
from dunning.models import DunningPolicy, TransitionReceipt
from dunning.policy.publishing import NoPolicyError, policy_for_prices, policy_provider, policy_publish
from dunning.rollout.rebinding import rollout_rebind_forward
from subscriptions.models import Subscription
from tests.rollout.conftest import grace
from tests.support.actors import LEADS, make_staff, staff_roles_from_migration
from tests.support.builders import make_policy, make_subscription, open_cycle

ALIPAY_APP = "2021000000000001"
ALIPAY = {"name": "alipay", "account": ALIPAY_APP}


def alipay_subscription(*, price: str = "alipay_monthly", account: str = ALIPAY_APP, n: int = 1) -> Subscription:
    return make_subscription(price=price, provider="alipay", provider_account=account,
                             provider_subscription_id=f"2021560300000000000{n}")


def shipped_alipay() -> DunningPolicy:
    text = Path("dunning/policy/shipped/alipay-monthly.yaml").read_text()
    return policy_publish(text=text)[0]


def test_an_alipay_subscription_binds_the_alipay_policy_even_when_a_stripe_policy_lists_its_price(db):
    alipay = shipped_alipay()
    stripe = make_policy(policy="stripe-lists-it@1", applies_to={"prices": ["alipay_monthly"], "cohort": "default"})
    assert stripe.published_at > alipay.published_at, "the Stripe policy is the newer one"
    sub = alipay_subscription()
    assert sub.policy == alipay
    assert (sub.provider, sub.provider_account) == ("alipay", ALIPAY_APP)
    assert open_cycle(sub, currency="cny").policy == alipay
    assert make_subscription(price="alipay_monthly").policy == stripe


def test_a_stripe_subscription_never_binds_the_alipay_default(db):
    shipped_alipay()
    with pytest.raises(OpeningRefused, match="no policy is published for provider 'stripe'") as refused:
        make_subscription(price="price_nobody_names")
    assert refused.value.code == "NO_POLICY_FOR_PRICE"
    catch_all = make_policy(policy="stripe-default@1", default=True)
    assert make_subscription(price="price_nobody_names").policy == catch_all


def test_an_alipay_price_on_an_invoice_picks_an_alipay_policy(db):
    default = shipped_alipay()
    annual = make_policy(policy="alipay-annual@1", provider=ALIPAY,
                         applies_to={"prices": ["alipay_annual"], "cohort": "default"})
    make_policy(policy="stripe-annual@1", applies_to={"prices": ["alipay_annual"], "cohort": "default"})
    sub = alipay_subscription()
    assert sub.policy == default
    cycle = cycle_open_for_invoice(subscription_pk=sub.pk, cause=Cause.system("test"), invoice=InvoiceFacts(
        provider_invoice_id="20260101000000000001", amount_due=2900, currency="cny", price_ids=("alipay_annual",)))
    assert cycle.policy == annual, "the invoice's own price picks the cycle's policy, within Alipay"


def test_a_policy_for_the_subscriptions_own_account_wins(db):
    other = make_policy(policy="other-account@1", provider={"name": "stripe", "account": "acct_other"})
    own = make_policy(policy="own-account@1", provider={"name": "stripe", "account": "acct_test"})
    newer_other = make_policy(policy="other-account@2", provider={"name": "stripe", "account": "acct_other"})
    assert newer_other.published_at > own.published_at > other.published_at
    assert make_subscription().policy == own, "own account first, although another account's policy is newer"
    on_third = make_subscription(provider_account="acct_third")
    assert on_third.policy == newer_other, "no policy of its account: the newest of the provider's others"
    # Inside the account preference the order stays price-then-default:
    own_default = make_policy(policy="own-default@1", default=True, applies_to={"prices": [], "cohort": "default"})
    assert policy_for_prices(("price_test",), cohort="default", provider="stripe", account="acct_test") == own
    assert policy_for_prices(("price_z",), cohort="default", provider="stripe", account="acct_test") == own_default
    assert policy_for_prices(("price_z",), cohort="default", provider="stripe", account="acct_other") == own_default


def test_an_account_match_outranks_another_accounts_price_match(db):
    """A price id belongs to one provider account: another account's policy listing the same id
    is about a different price, so the subscription's own account's default wins."""
    make_policy(policy="other-lists-it@1", provider={"name": "stripe", "account": "acct_other"})
    own_default = make_policy(policy="own-default@1", default=True, applies_to={"prices": [], "cohort": "default"})
    assert policy_for_prices(("price_test",), cohort="default", provider="stripe", account="acct_test") == own_default


def test_no_policy_for_the_provider_is_an_error_naming_it(db):
    make_policy(policy="stripe-default@1", default=True)
    with pytest.raises(NoPolicyError, match="provider 'alipay'"):
        policy_for_prices(("alipay_monthly",), cohort="default", provider="alipay", account=ALIPAY_APP)
    with pytest.raises(OpeningRefused, match="provider 'alipay'"):
        alipay_subscription()
    assert not Subscription.objects.filter(provider="alipay").exists()


def test_the_previous_version_stays_within_the_provider(db):
    kind_alipay = make_policy(policy="shared-name@1", provider=ALIPAY, grace=grace("P14D"))
    make_policy(policy="shared-name@2", grace=grace("P10D"))  # a Stripe version in between
    strict_alipay = make_policy(policy="shared-name@3", provider=ALIPAY, grace=grace("P4D"))
    assert previous_policy_version(strict_alipay) == kind_alipay, "the Stripe v2 is skipped"
    lone_stripe = make_policy(policy="other-name@2", grace=grace("P4D"))
    make_policy(policy="other-name@1", provider=ALIPAY, grace=grace("P30D"))
    with pytest.raises(IncidentError, match="no previous version to roll back to among stripe policies"):
        previous_policy_version(lone_stripe)


def test_binding_refuses_a_policy_of_another_provider(db):
    staff_roles_from_migration()
    lead = make_staff("lead", LEADS, password="x", email="lead@example.com")
    alipay = shipped_alipay()
    stripe_policy = make_policy()
    sub = alipay_subscription()
    result = subscription_accept_change(subscription_pk=sub.pk, change="rebind_policy",
                                        expect_root=sub.outstanding_cycle_root, policy_pk=stripe_policy.pk,
                                        cause=Cause.staff(lead, reason="try", ticket="T-1"))
    assert not result.accepted and result.reason == "PROVIDER_MISMATCH"
    assert "alipay" in result.detail and "stripe" in result.detail
    sub.refresh_from_db()
    assert sub.policy == alipay
    assert TransitionReceipt.objects.filter(subscription=sub, accepted=False, rejection_reason="PROVIDER_MISMATCH")


def test_forward_rebind_moves_only_the_targets_provider(db):
    staff_roles_from_migration()
    lead = make_staff("lead", LEADS, password="x", email="lead@example.com")
    v1 = make_policy(policy="shared-name@1", default=True)
    make_policy(policy="alipay-default@1", provider=ALIPAY, default=True)
    stripe_sub = make_subscription(price="price_z")
    alipay_sub = alipay_subscription()
    alipay_v2 = make_policy(policy="shared-name@2", provider=ALIPAY, default=True)
    assert stripe_sub.policy == v1
    run = rollout_rebind_forward(cohort="default", to_policy=alipay_v2, by=lead, reason="ship", ticket="R-1")
    assert (run.examined, run.changed, run.refused) == (0, 0, 0), "the Stripe subscription is not the target's"
    stripe_sub.refresh_from_db()
    assert stripe_sub.policy == v1
    alipay_sub.refresh_from_db()
    assert policy_provider(alipay_sub.policy) == ("alipay", ALIPAY_APP)


def test_shipped_alipay_policy_maps_alipay_sub_codes(db):
    spec = shipped_alipay().spec
    assert (spec.provider_name, spec.provider_account, spec.is_default) == ("alipay", ALIPAY_APP, True)
    assert spec.retry_authority == "LOCAL" and spec.max_attempts == 3
    assert spec.failure_class_for("ACQ.BALANCE_NOT_ENOUGH") == "RETRYABLE"
    assert spec.failure_class_for("ACQ.SYSTEM_ERROR") == "TRANSIENT_UNKNOWN"
    assert spec.failure_class_for("acq.agreement_status_not_normal") == "CUSTOMER_ACTION"
    assert json.loads(json.dumps(spec.canonical))["provider"] == ALIPAY
