"""Review verdicts (SPEC §14, seed 002): the seed's exercises on real PostgreSQL state built through
the acceptance service, then the pure evaluator blocker by blocker, its totality and its bounds.

Each named seed exercise builds its state with tests/support/builders.py (the acceptance service), loads
it with ``subscription_review`` and asserts the verdict. States the real system refuses to produce
(a hard decline with a retry still scheduled, a copied grace window …) are derived from a loaded
real review with ``dataclasses.replace``, next to a check that the service indeed refuses them.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from hypothesis import given, settings
from hypothesis import strategies as st

from dunning import states as model_states
from dunning.acceptance.inputs import Cause, Evidence, InvoiceUpdate
from dunning.acceptance.opening import subscription_register
from dunning.clock import trusted_now
from dunning.evidence.next_edge import cycle_reconcile_with_invoice
from dunning.models import OutboxMessage, TransitionReceipt
from dunning.reads import verdicts as v
from dunning.reads.review import policy_facts, subscription_review, subscription_verdict
from dunning.reads.verdicts import (
    HOLD,
    READY,
    CycleReview,
    Notice,
    PolicyFacts,
    SubscriptionReview,
    Verdict,
    evaluate,
)
from entitlements.models import EntitlementSnapshot
from subscriptions.models import Customer
from subscriptions.providers.base import ProviderInvoice
from tests.support.builders import (
    accept,
    fail_first_payment,
    invoice_receipt,
    local_policy,
    make_policy,
    make_subscription,
    open_cycle,
    paid_evidence,
    reload,
    unpaid_evidence,
)
from tests.support.paths import LOCAL_ONLY, PATH_TO, Walker
from tests.support.paths import T0 as PATH_T0

SEED_PRICE = "price_seed002_monthly"
FULL_GRACE_PRICE = "price_seed002_fullgrace"
DAY = timedelta(days=1)


@pytest.fixture
def seed_policy(db):
    """Seed 002's monthly policy: three attempts, seven days of grace on the LIMITED profile."""
    return make_policy(policy="seed002-monthly@1", applies_to={"prices": [SEED_PRICE], "cohort": "default"},
                       grace={"starts": "FIRST_FAILURE", "duration": "P7D", "profile": "LIMITED"}, maxAttempts=3)


def provider_says(cycle, *, now: datetime, attempt_count: int, next_payment_attempt: datetime | None,
                  status: str = "open") -> Evidence:
    """A fresh provider fetch of the cycle's invoice: Stripe's attempt_count / next_payment_attempt."""
    inv = reload(cycle).invoice
    return Evidence(
        receipt=invoice_receipt(cycle, status, fetched_at=now),
        invoice=InvoiceUpdate(status=status, amount_due=inv.amount_due, amount_paid=0, attempt_count=attempt_count,
                              next_payment_attempt=next_payment_attempt),
    )


def build_baseline(now: datetime):
    """SUB-M-001 / INV-1001: retryable failure, first attempt recorded, the provider's next attempt in
    two days, failure notice requested, 7-day LIMITED grace."""
    sub = make_subscription(price=SEED_PRICE, now=now)
    cycle = open_cycle(sub, now=now)
    retry_at = now + 2 * DAY
    evidence = provider_says(cycle, now=now, attempt_count=1, next_payment_attempt=retry_at)
    assert accept(cycle, "record_failure", decline_code="insufficient_funds", evidence=evidence, now=now)
    assert accept(cycle, "start_grace", now=now)
    assert accept(cycle, "schedule_retry", next_attempt_at=retry_at, now=now)
    sub.refresh_from_db()
    return sub, reload(cycle)


def only_cycle(review: SubscriptionReview) -> CycleReview:
    (cycle,) = review.cycles
    return cycle


def with_cycle(review: SubscriptionReview, **changes) -> SubscriptionReview:
    return replace(review, cycles=(replace(only_cycle(review), **changes),))


def staff_cause(user, ticket: str = "SUP-2002") -> Cause:
    return Cause.staff(user, reason="goodwill while the customer replaces the card", ticket=ticket)


# --- seed 002: guided baseline --------------------------------------------------------------------

@pytest.mark.django_db
def test_guided_baseline_retryable_failure_in_seven_day_grace_is_review_ready(seed_policy):
    now = trusted_now()
    sub, cycle = build_baseline(now)

    # Access comes from the policy's grace profile, not from payment state or provider status.
    assert sub.policy == seed_policy
    assert sub.provider_status == "active"
    assert sub.entitlement_profile == "LIMITED"
    latest = EntitlementSnapshot.objects.filter(subscription=sub).order_by("-generation").first()
    assert latest.profile == "LIMITED" and "blocking cycle" in latest.reason

    review = subscription_review(sub, now=now + timedelta(hours=1))
    c = only_cycle(review)
    assert (c.state, c.failure_class, c.customer_action_required) == ("RETRY_SCHEDULED", "RETRYABLE", False)
    assert c.attempts_made == 1 and c.policy.max_attempts == 3 and c.policy.identity == "seed002-monthly@1"
    assert c.next_attempt_at == now + 2 * DAY > review.now
    assert c.grace_expires_at - c.grace_started_at == timedelta(days=7)
    assert [n.template for n in c.notices] == ["payment_failed"]
    assert c.audit_ref == TransitionReceipt.objects.filter(cycle=cycle, accepted=True).latest("id").pk
    assert review.expected_profile == "LIMITED" and review.entitlement_profile == "LIMITED"

    verdict = evaluate(review)
    assert verdict == Verdict(READY, ())
    assert subscription_verdict(sub, now=now + timedelta(hours=1)) == verdict
    # Whatever the provider calls the subscription, the verdict does not move.
    for status in ("active", "past_due", "unpaid", "canceled"):
        assert evaluate(replace(review, provider_status=status)) == verdict


@pytest.mark.django_db
def test_baseline_with_full_access_taken_from_provider_status_holds(seed_policy):
    """Failure mode 1: 'past_due' (or 'active') turned straight into access is not the policy's decision."""
    now = trusted_now()
    sub, _ = build_baseline(now)
    review = subscription_review(sub, now=now + DAY)
    verdict = evaluate(replace(review, entitlement_profile="FULL", provider_status="active"))
    assert verdict.status == HOLD
    assert verdict.codes == ("HOLD_ENTITLEMENT_NOT_FROM_POLICY",)
    assert "LIMITED" in verdict.blockers[0].detail


# --- seed 002: mutation 1, non-retryable with a retry still scheduled --------------------------------

@pytest.mark.django_db
def test_mutation_nonretryable_failure_with_retry_still_scheduled_holds(seed_policy):
    now = trusted_now()
    sub, cycle = build_baseline(now)
    review = subscription_review(sub, now=now + DAY)
    mutated = with_cycle(review, failure_class="NON_RETRYABLE")  # retry_eligible and next_attempt_at kept

    verdict = evaluate(mutated)
    assert verdict.status == HOLD
    assert verdict.codes == ("HOLD_NONRETRYABLE_RETRY_CONFLICT",)
    assert verdict.blockers[0].cycle_id == str(cycle.cycle_id)
    assert str(cycle.cycle_id) in verdict.blockers[0].detail
    # The same contradiction whether the schedule shows as a time or only as the state.
    assert evaluate(with_cycle(review, failure_class="NON_RETRYABLE", next_attempt_at=None)).codes == (
        "HOLD_NONRETRYABLE_RETRY_CONFLICT",)
    assert evaluate(with_cycle(review, failure_class="CUSTOMER_ACTION", customer_action_required=True)).codes == (
        "HOLD_NONRETRYABLE_RETRY_CONFLICT",)


@pytest.mark.django_db
def test_real_hard_decline_turns_retry_off_and_asks_the_customer_to_act(seed_policy):
    """The acceptance service never produces mutation 1: a stolen card ends with no retry scheduled."""
    now = trusted_now()
    sub = make_subscription(price=SEED_PRICE, now=now)
    cycle = open_cycle(sub, now=now)
    stripe_retry_at = now + 2 * DAY  # the provider may still show a schedule: telemetry, not permission
    evidence = provider_says(cycle, now=now, attempt_count=1, next_payment_attempt=stripe_retry_at)
    assert accept(cycle, "record_failure", decline_code="stolen_card", evidence=evidence, now=now)
    assert accept(cycle, "start_grace", now=now)

    refused = accept(cycle, "schedule_retry", next_attempt_at=stripe_retry_at, now=now)
    assert not refused and refused.reason == "NON_RETRYABLE_NO_RETRY"

    stored = reload(cycle)
    assert stored.failure_class == "NON_RETRYABLE" and stored.customer_action_required
    assert stored.next_attempt_at is None
    assert stored.invoice.next_payment_attempt == stripe_retry_at
    assert stored.subscription.entitlement_profile == "LIMITED"
    review = subscription_review(sub, now=now + DAY)
    assert only_cycle(review).customer_action_required and only_cycle(review).next_attempt_at is None
    assert evaluate(review) == Verdict(READY, ())


# --- seed 002: mutation 2, grace expired but access still FULL ---------------------------------------

@pytest.mark.django_db
def test_mutation_grace_expired_with_entitlement_still_full_holds(seed_policy):
    now = trusted_now()
    sub, _ = build_baseline(now)
    review = subscription_review(sub, now=now)
    expires = only_cycle(review).grace_expires_at
    mutated = replace(review, now=expires + timedelta(seconds=1), entitlement_profile="FULL")

    verdict = evaluate(mutated)
    assert verdict.status == HOLD
    assert "HOLD_GRACE_EXPIRED_ENTITLEMENT_NOT_RECOMPUTED" in verdict.codes
    # Nothing else about the cycle is wrong; FULL also contradicts the stored LIMITED decision.
    assert set(verdict.codes) == {"HOLD_GRACE_EXPIRED_ENTITLEMENT_NOT_RECOMPUTED", "HOLD_ENTITLEMENT_NOT_FROM_POLICY"}
    # Before expiry the grace-expired blocker does not fire.
    assert "HOLD_GRACE_EXPIRED_ENTITLEMENT_NOT_RECOMPUTED" not in evaluate(
        replace(mutated, now=expires - timedelta(seconds=1))).codes


@pytest.mark.django_db
def test_real_grace_expiry_holds_until_the_sweep_recomputes_access(db):
    """A policy whose grace keeps FULL access: once the trusted clock passes expiry, FULL is a HOLD
    until the sweep's edges run (expire_grace, begin_restriction on a fresh unpaid receipt,
    complete_restriction) and the restricted profile is issued."""
    make_policy(policy="seed002-fullgrace@1", applies_to={"prices": [FULL_GRACE_PRICE], "cohort": "default"},
                grace={"starts": "FIRST_FAILURE", "duration": "P7D", "profile": "FULL"}, maxAttempts=3)
    now = trusted_now()
    sub = make_subscription(price=FULL_GRACE_PRICE, now=now)
    cycle = open_cycle(sub, now=now)
    fail_first_payment(cycle, now=now)
    assert reload(cycle).subscription.entitlement_profile == "FULL"
    assert subscription_verdict(sub, now=now + DAY).ready

    later = reload(cycle).grace_expires_at + timedelta(seconds=1)
    assert subscription_verdict(sub, now=later).codes == ("HOLD_GRACE_EXPIRED_ENTITLEMENT_NOT_RECOMPUTED",)

    assert accept(cycle, "expire_grace", now=later)
    assert subscription_verdict(sub, now=later).codes == ("HOLD_GRACE_EXPIRED_ENTITLEMENT_NOT_RECOMPUTED",)
    assert accept(cycle, "begin_restriction", evidence=unpaid_evidence(cycle, now=later), now=later)
    assert accept(cycle, "complete_restriction", now=later)

    assert reload(cycle).subscription.entitlement_profile == "SUSPENDED"
    assert subscription_verdict(sub, now=later) == Verdict(READY, ())


@pytest.mark.django_db
def test_grace_expired_full_access_is_ready_only_while_a_complete_exception_covers_it(seed_policy, staff):
    now = trusted_now()
    sub = make_subscription(price=SEED_PRICE, now=now)
    cycle = open_cycle(sub, now=now)
    fail_first_payment(cycle, now=now)
    later = reload(cycle).grace_expires_at + timedelta(seconds=1)
    assert accept(cycle, "expire_grace", now=later)
    assert subscription_verdict(sub, now=later).ready  # GRACE_EXPIRED, still LIMITED: restriction waits

    until = later + 3 * DAY
    assert accept(cycle, "grant_exception", cause=staff_cause(staff), expires_at=until, now=later)
    assert reload(cycle).subscription.entitlement_profile == "FULL"
    assert subscription_verdict(sub, now=later + DAY) == Verdict(READY, ())

    # The exception ran out by the trusted clock but FULL is still issued: not covered any more.
    ran_out = until + timedelta(seconds=1)
    assert subscription_verdict(sub, now=ran_out).codes == ("HOLD_GRACE_EXPIRED_ENTITLEMENT_NOT_RECOMPUTED",)
    assert accept(cycle, "expire_exception", now=ran_out)
    assert reload(cycle).subscription.entitlement_profile == "LIMITED"
    assert subscription_verdict(sub, now=ran_out) == Verdict(READY, ())


# --- seed 002: mutation 3, attempts above budget -----------------------------------------------------

@pytest.mark.django_db
def test_mutation_attempts_above_budget_holds(seed_policy):
    now = trusted_now()
    sub, _ = build_baseline(now)
    review = subscription_review(sub, now=now + DAY)
    verdict = evaluate(with_cycle(review, attempts_made=4))
    assert verdict.status == HOLD and verdict.codes == ("HOLD_ATTEMPTS_OVER_BUDGET",)
    assert "4" in verdict.blockers[0].detail and "3" in verdict.blockers[0].detail


@pytest.mark.django_db
def test_real_budget_is_bounded_and_provider_attempts_past_it_hold(seed_policy):
    now = trusted_now()
    sub, cycle = build_baseline(now)
    for attempt in (2, 3):
        t = now + attempt * DAY
        nxt = t + DAY if attempt < 3 else None
        failed = provider_says(cycle, now=t, attempt_count=attempt, next_payment_attempt=nxt)
        assert accept(cycle, "retry_failed", decline_code="insufficient_funds", evidence=failed, now=t)
        assert accept(cycle, "return_to_grace", now=t)
        if nxt is not None:
            assert accept(cycle, "schedule_retry", next_attempt_at=nxt, now=t)
    t = now + 3 * DAY
    refused = accept(cycle, "schedule_retry", next_attempt_at=t + DAY, now=t)
    assert not refused and refused.reason == "ATTEMPT_BUDGET_EXHAUSTED"
    assert subscription_verdict(sub, now=t) == Verdict(READY, ())  # 3 of 3: bounded, not over

    # The provider retried past the policy (its own schedule disagrees with maxAttempts 3).
    t4 = t + timedelta(hours=1)
    assert accept(cycle, "record_evidence", evidence=provider_says(cycle, now=t4, attempt_count=4,
                                                                   next_payment_attempt=None), now=t4)
    verdict = subscription_verdict(sub, now=t4)
    assert verdict.codes == ("HOLD_ATTEMPTS_OVER_BUDGET",)
    assert str(cycle.cycle_id) in verdict.blockers[0].detail


# --- seed 002: independent exercise, recovery then a duplicate payment_failed ------------------------

@pytest.mark.django_db
def test_independent_recovery_then_duplicate_failure_creates_no_new_dunning(seed_policy):
    now = trusted_now()
    sub, cycle = build_baseline(now)
    paid_at = now + DAY
    assert accept(cycle, "recover", evidence=paid_evidence(cycle, now=paid_at), now=paid_at)
    assert reload(cycle).state == "RECOVERED"
    assert reload(cycle).subscription.entitlement_profile == "FULL"
    notices_before = OutboxMessage.objects.filter(subscription=sub, topic="notification.requested").count()

    # A duplicate payment_failed arrives: the failure edges are refused on a recovered cycle ...
    dup_at = paid_at + timedelta(minutes=5)
    for edge, params in (("record_failure", {"decline_code": "insufficient_funds"}), ("start_grace", {})):
        result = accept(cycle, edge, now=dup_at, **params)
        assert not result and result.reason == "EDGE_NOT_ALLOWED"
        assert TransitionReceipt.objects.filter(cycle=cycle, edge=edge, accepted=False).exists()
    # ... and the webhook path, which fetches the invoice again (paid), plans nothing that notifies.
    inv = reload(cycle).invoice
    fetched = ProviderInvoice(
        id=inv.provider_invoice_id, account="acct_test", subscription_id=sub.provider_subscription_id,
        customer_id=None, status="paid", amount_due=inv.amount_due, amount_paid=inv.amount_due, currency="usd",
        attempt_count=2, next_payment_attempt=None, payment_refs=("pi_dup",), price_ids=(SEED_PRICE,),
    )
    results = cycle_reconcile_with_invoice(cycle_pk=cycle.pk, inv=fetched,
                                           receipt=invoice_receipt(cycle, "paid", fetched_at=dup_at),
                                           decline_code="insufficient_funds", cause=Cause.event("evt_dup"),
                                           now=dup_at)
    assert all(r.edge == "record_evidence" for r in results)

    assert OutboxMessage.objects.filter(subscription=sub, topic="notification.requested").count() == notices_before
    assert reload(cycle).state == "RECOVERED"
    assert subscription_verdict(sub, now=dup_at + DAY) == Verdict(READY, ())


@pytest.mark.django_db
def test_independent_dunning_notice_after_recovery_holds(seed_policy):
    now = trusted_now()
    sub, cycle = build_baseline(now)
    paid_at = now + DAY
    assert accept(cycle, "recover", evidence=paid_evidence(cycle, now=paid_at), now=paid_at)
    assert subscription_verdict(sub, now=paid_at + DAY).ready

    # A faulty sender requests a reminder for the settled cycle anyway.
    OutboxMessage.objects.create(
        topic="notification.requested", dedupe_key=f"faulty:{cycle.cycle_id}:grace_reminder",
        payload={"subscription": sub.pk, "cycle": str(cycle.cycle_id), "template": "grace_reminder"},
        subscription=sub, receipt=None, created_at=paid_at + timedelta(hours=1),
    )
    verdict = subscription_verdict(sub, now=paid_at + DAY)
    assert verdict.status == HOLD and verdict.codes == ("HOLD_DUNNING_AFTER_RECOVERY",)
    assert "grace_reminder" in verdict.blockers[0].detail and str(cycle.cycle_id) in verdict.blockers[0].detail


# --- seed 002: transfer to annual, no grace, hard decline -------------------------------------------

def register_annual(now: datetime):
    customer = Customer.objects.create(email="annual@example.com", provider_customer_id="cus_seed002_annual")
    return subscription_register(customer=customer, provider_account="acct_demo",
                                 provider_subscription_id="sub_seed002_annual", price_id="price_annual_pro",
                                 billing_interval="year", cause=Cause.system("test"), now=now)


@pytest.mark.django_db
def test_transfer_annual_no_grace_hard_decline_is_ready_only_when_recomputed(shipped_policies):
    now = trusted_now()
    sub = register_annual(now)
    assert sub.policy.identity == "annual-no-grace@1" and sub.billing_interval == "year"
    cycle = open_cycle(sub, amount=24000, now=now)
    evidence = provider_says(cycle, now=now, attempt_count=1, next_payment_attempt=None)
    assert accept(cycle, "record_failure", decline_code="stolen_card", evidence=evidence, now=now)
    assert accept(cycle, "start_grace", now=now)

    stored = reload(cycle)
    assert stored.failure_class == "NON_RETRYABLE" and stored.customer_action_required
    assert stored.next_attempt_at is None
    assert stored.grace_expires_at == stored.grace_started_at  # zero-length grace, not a monthly copy
    refused = accept(cycle, "schedule_retry", next_attempt_at=now + DAY, now=now)
    assert not refused and refused.reason == "NON_RETRYABLE_NO_RETRY"

    # The grace sweep's edges, with a fresh receipt showing the invoice still unpaid.
    later = now + timedelta(seconds=1)
    assert accept(cycle, "expire_grace", now=later)
    assert accept(cycle, "begin_restriction", evidence=unpaid_evidence(cycle, now=later), now=later)
    assert accept(cycle, "complete_restriction", now=later)
    stored = reload(cycle)
    assert stored.state == "RESTRICTED" and stored.subscription.entitlement_profile == "SUSPENDED"

    review = subscription_review(sub, now=later)
    assert evaluate(review) == Verdict(READY, ())

    # The same cycle with the monthly 7-day window copied over is not a transfer.
    c = only_cycle(review)
    copied = evaluate(with_cycle(review, grace_expires_at=c.grace_started_at + timedelta(days=7)))
    assert copied.status == HOLD and copied.codes == ("HOLD_POLICY_NOT_TRANSFERRED",)
    assert "annual-no-grace@1" in copied.blockers[0].detail
    # So is binding the annual subscription (or its cycle) to the monthly policy itself.
    monthly = policy_facts(shipped_policies["standard-monthly"])
    assert evaluate(replace(review, policy=monthly)).codes == ("HOLD_POLICY_NOT_TRANSFERRED",)
    assert evaluate(with_cycle(review, policy=monthly)).codes == ("HOLD_POLICY_NOT_TRANSFERRED",)

    # Cancellation follows the annual policy's own delay (P60D), not the monthly P30D.
    restricted_at = stored.restricted_at
    early = accept(cycle, "request_cancellation", cause=Cause.job("cancel_sweep"), now=restricted_at + 30 * DAY)
    assert not early and early.reason == "CANCEL_NOT_DUE"
    assert accept(cycle, "request_cancellation", cause=Cause.job("cancel_sweep"), now=restricted_at + 60 * DAY)


# --- seed 002: manual override without owner / ticket / expiry --------------------------------------

@pytest.mark.django_db
def test_override_without_owner_ticket_or_expiry_holds(seed_policy, staff):
    now = trusted_now()
    sub = make_subscription(price=SEED_PRICE, now=now)
    cycle = open_cycle(sub, now=now)
    fail_first_payment(cycle, now=now)
    assert accept(cycle, "grant_exception", cause=staff_cause(staff), expires_at=now + 3 * DAY, now=now)
    review = subscription_review(sub, now=now + DAY)
    c = only_cycle(review)
    assert (c.state, c.exception_owner, c.exception_ticket) == ("EXCEPTION_ACTIVE", "agent", "SUP-2002")
    assert evaluate(review) == Verdict(READY, ())

    for changes, word in (({"exception_owner": ""}, "owner"), ({"exception_ticket": "  "}, "ticket"),
                          ({"exception_expires_at": None}, "expiry"), ({"exception_reason": ""}, "reason")):
        verdict = evaluate(with_cycle(review, **changes))
        assert verdict.status == HOLD and verdict.codes == ("HOLD_OVERRIDE_INCOMPLETE",), changes
        assert word in verdict.blockers[0].detail


@pytest.mark.django_db
def test_blank_owner_through_the_service_falls_back_to_the_deciding_staff_member(seed_policy, staff):
    """A whitespace owner is no owner: the exception is owned by the staff member who granted it."""
    now = trusted_now()
    sub = make_subscription(price=SEED_PRICE, now=now)
    cycle = open_cycle(sub, now=now)
    fail_first_payment(cycle, now=now)
    result = accept(cycle, "grant_exception", cause=staff_cause(staff), expires_at=now + DAY, owner="   ", now=now)
    assert result.accepted, result
    assert reload(cycle).exception_owner == staff.get_username()
    assert "HOLD_OVERRIDE_INCOMPLETE" not in subscription_verdict(sub, now=now).codes


# --- healthy subscriptions --------------------------------------------------------------------------

@pytest.mark.django_db
def test_healthy_subscription_is_ready(seed_policy):
    now = trusted_now()
    sub = make_subscription(price=SEED_PRICE, now=now)
    assert subscription_verdict(sub, now=now) == Verdict(READY, ())
    cycle = open_cycle(sub, now=now)
    assert subscription_verdict(sub, now=now) == Verdict(READY, ())
    assert accept(cycle, "recover", evidence=paid_evidence(cycle, now=now), now=now)  # paid at renewal
    assert subscription_verdict(sub, now=now + DAY) == Verdict(READY, ())


@pytest.mark.django_db
@pytest.mark.parametrize("state", list(PATH_TO))
def test_every_state_the_acceptance_service_reaches_is_review_ready(staff, state):
    """The verdict is an oracle for the real system: no state reached through accepted edges holds,
    except an evidence conflict, which waits for a person by design."""
    make_policy()
    local_policy()
    price = "price_local" if state in LOCAL_ONLY else "price_test"
    walker = Walker(open_cycle(make_subscription(price=price, now=PATH_T0), now=PATH_T0), staff=staff)
    PATH_TO[state](walker)
    assert reload(walker.cycle).state == state
    verdict = subscription_verdict(walker.cycle.subscription, now=walker.now)
    expected = ("HOLD_EVIDENCE_CONFLICT",) if state == "EVIDENCE_CONFLICT" else ()
    assert verdict.codes == expected, [b.detail for b in verdict.blockers]


# --- the loader -------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_review_is_loaded_in_a_constant_number_of_queries(seed_policy, staff):
    now = trusted_now()
    sub, _ = build_baseline(now)
    with CaptureQueriesContext(connection) as one:
        subscription_review(sub, now=now)
    for _ in range(3):
        extra = open_cycle(sub, now=now)
        fail_first_payment(extra, now=now)
    assert accept(extra, "recover", evidence=paid_evidence(extra, now=now), now=now)
    open_cycle(sub, now=now)
    with CaptureQueriesContext(connection) as many:
        review = subscription_review(sub, now=now)
    assert len(review.cycles) == 5
    # Four reads of the subscription's rows, and one of the rollout stage in force (issue 19).
    assert len(many.captured_queries) == len(one.captured_queries) <= 5


@pytest.mark.django_db
def test_loader_orders_notices_by_receipt_against_the_settling_receipt(seed_policy):
    now = trusted_now()
    sub, cycle = build_baseline(now)
    assert accept(cycle, "recover", evidence=paid_evidence(cycle, now=now), now=now)  # same trusted instant
    c = only_cycle(subscription_review(sub, now=now))
    settle = TransitionReceipt.objects.filter(cycle=cycle, accepted=True, to_state="RECOVERED").latest("id")
    assert c.settled_receipt_id == settle.pk and c.audit_ref == settle.pk
    assert sorted(n.template for n in c.notices) == ["payment_failed", "payment_recovered"]
    assert evaluate(subscription_review(sub, now=now)).ready  # payment_failed came before, at the same time


# --- pure evaluator: one test per blocker -----------------------------------------------------------

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
MONTHLY = PolicyFacts(identity="seed002-monthly@1", has_grace=True, grace_duration=timedelta(days=7),
                      grace_profile="LIMITED", restricted_profile="SUSPENDED", max_attempts=3,
                      retry_authority="PAYMENT_PROVIDER", prices=(SEED_PRICE,))
NO_GRACE = PolicyFacts(identity="annual-no-grace@1", has_grace=False, grace_duration=timedelta(0),
                       grace_profile="SUSPENDED", restricted_profile="SUSPENDED", max_attempts=2,
                       retry_authority="PAYMENT_PROVIDER", prices=("price_annual_pro",))


def grace_cycle(**changes) -> CycleReview:
    base = CycleReview(
        cycle_id="c-1", state="RETRY_SCHEDULED", policy=MONTHLY, failure_class="RETRYABLE",
        next_attempt_at=T0 + 2 * DAY, attempts_made=1, grace_started_at=T0, grace_expires_at=T0 + 7 * DAY,
        audit_ref=10, notices=(Notice("payment_failed", T0, 8),), invoice_ref="in_1001",
    )
    return replace(base, **changes)


def review_of(*cycles: CycleReview, **changes) -> SubscriptionReview:
    base = SubscriptionReview(subscription_id="1", billing_interval="month", price_id=SEED_PRICE,
                              entitlement_profile="LIMITED", policy=MONTHLY, now=T0 + DAY, cycles=cycles,
                              expected_profile="LIMITED")
    return replace(base, **changes)


def codes(review: SubscriptionReview) -> tuple[str, ...]:
    return evaluate(review).codes


def test_pure_baseline_is_ready():
    assert evaluate(review_of(grace_cycle())) == Verdict(READY, ())
    assert evaluate(review_of(entitlement_profile="FULL", expected_profile="FULL")) == Verdict(READY, ())
    assert evaluate(review_of(grace_cycle(state="CURRENT", audit_ref=None, policy=None))).ready


def test_pure_nonretryable_retry_conflict():
    assert codes(review_of(grace_cycle(failure_class="NON_RETRYABLE"))) == ("HOLD_NONRETRYABLE_RETRY_CONFLICT",)
    assert codes(review_of(grace_cycle(failure_class="NON_RETRYABLE", customer_action_required=True,
                                       state="GRACE_ACTIVE"))) == ("HOLD_NONRETRYABLE_RETRY_CONFLICT",)
    assert codes(review_of(grace_cycle(failure_class="NON_RETRYABLE", customer_action_required=True,
                                       state="GRACE_ACTIVE", next_attempt_at=None))) == ()


def test_pure_customer_action_not_required():
    off = grace_cycle(failure_class="CUSTOMER_ACTION", state="GRACE_ACTIVE", next_attempt_at=None)
    assert codes(review_of(off)) == ("HOLD_CUSTOMER_ACTION_NOT_REQUIRED",)
    assert codes(review_of(replace(off, customer_action_required=True))) == ()


def test_pure_attempts_over_budget_and_unbounded_budget():
    assert codes(review_of(grace_cycle(attempts_made=4))) == ("HOLD_ATTEMPTS_OVER_BUDGET",)
    assert codes(review_of(grace_cycle(attempts_made=3))) == ("HOLD_ATTEMPTS_OVER_BUDGET",)  # a 4th is scheduled
    assert codes(review_of(grace_cycle(attempts_made=3, state="GRACE_ACTIVE", next_attempt_at=None))) == ()
    assert codes(review_of(grace_cycle(attempts_made=None))) == ("HOLD_ATTEMPTS_OVER_BUDGET",)
    unbounded = replace(MONTHLY, max_attempts=None)
    assert codes(review_of(grace_cycle(policy=unbounded), policy=unbounded)) == ("HOLD_ATTEMPTS_OVER_BUDGET",)


def test_pure_grace_without_expiry():
    assert codes(review_of(grace_cycle(grace_expires_at=None))) == ("HOLD_GRACE_WITHOUT_EXPIRY",)
    assert codes(review_of(grace_cycle(grace_expires_at=None, state="RESTRICTED", next_attempt_at=None),
                           entitlement_profile="SUSPENDED", expected_profile="SUSPENDED")) == (
        "HOLD_GRACE_WITHOUT_EXPIRY",)
    assert codes(review_of(grace_cycle(grace_expires_at=None, state="PAYMENT_FAILED", next_attempt_at=None))) == ()


def test_pure_grace_expired_entitlement_not_recomputed():
    expired = T0 + 7 * DAY + timedelta(seconds=1)
    full = {"entitlement_profile": "FULL", "expected_profile": None}
    assert codes(review_of(grace_cycle(), now=expired, **full)) == ("HOLD_GRACE_EXPIRED_ENTITLEMENT_NOT_RECOMPUTED",)
    assert codes(review_of(grace_cycle(), now=T0 + 7 * DAY, **full)) == (
        "HOLD_GRACE_EXPIRED_ENTITLEMENT_NOT_RECOMPUTED",)  # expiry is inclusive, as the sweep's guard
    assert codes(review_of(grace_cycle(), now=expired)) == ()  # LIMITED: recomputed
    for state in ("GRACE_EXPIRED", "RESTRICTING", "RESTRICTED", "CANCEL_PENDING", "CANCELED"):
        assert codes(review_of(grace_cycle(state=state, next_attempt_at=None), **full)) == (
            "HOLD_GRACE_EXPIRED_ENTITLEMENT_NOT_RECOMPUTED",), state
    covered = grace_cycle(state="EXCEPTION_ACTIVE", suspended_state="GRACE_EXPIRED", next_attempt_at=None,
                          exception_owner="agent", exception_ticket="SUP-1", exception_reason="goodwill",
                          exception_expires_at=expired + DAY, exception_profile="FULL")
    assert codes(review_of(covered, now=expired, **full)) == ()
    assert codes(review_of(covered, now=expired + 2 * DAY, **full)) == (
        "HOLD_GRACE_EXPIRED_ENTITLEMENT_NOT_RECOMPUTED",)
    assert codes(review_of(replace(covered, exception_profile="LIMITED"), now=expired, **full)) == (
        "HOLD_GRACE_EXPIRED_ENTITLEMENT_NOT_RECOMPUTED",)
    # SHADOW / NOTIFY_ONLY keep access by design: not a missed recomputation.
    assert codes(review_of(grace_cycle(), now=expired, enforces_access=False, **full)) == ()


def test_pure_entitlement_not_from_policy():
    assert codes(review_of(grace_cycle(), entitlement_profile="FULL")) == ("HOLD_ENTITLEMENT_NOT_FROM_POLICY",)
    # Not enforcing (SHADOW / outside the rollout) or no recomputed decision given: not judged.
    assert codes(review_of(grace_cycle(), entitlement_profile="FULL", enforces_access=False)) == ()
    assert codes(review_of(grace_cycle(), entitlement_profile="FULL", expected_profile=None)) == ()


def test_pure_dunning_after_recovery():
    recovered = grace_cycle(state="RECOVERED", next_attempt_at=None, settled_at=T0 + DAY, settled_receipt_id=20)
    assert codes(review_of(recovered, entitlement_profile="FULL", expected_profile="FULL")) == ()
    late = (Notice("payment_recovered", T0 + DAY, 20), Notice("payment_failed", T0 + DAY, 21))
    hold = review_of(replace(recovered, notices=recovered.notices + late), entitlement_profile="FULL",
                     expected_profile="FULL")
    assert codes(hold) == ("HOLD_DUNNING_AFTER_RECOVERY",)
    # Receipt order wins over clock readings: a notice of the settling receipt itself is not "after".
    same_receipt = (Notice("payment_failed", T0 + 2 * DAY, 20),)
    assert codes(review_of(replace(recovered, notices=same_receipt), entitlement_profile="FULL",
                           expected_profile="FULL")) == ()
    # Without receipts, the trusted time decides; a recovery notice is not dunning.
    by_time = (Notice("grace_reminder", T0 + 2 * DAY, None),)
    assert codes(review_of(replace(recovered, notices=by_time, settled_receipt_id=None))) == (
        "HOLD_DUNNING_AFTER_RECOVERY",)
    assert codes(review_of(replace(recovered, notices=(Notice("payment_recovered", T0 + 2 * DAY),)))) == ()
    assert codes(review_of(replace(recovered, state="CLOSED_VOID", notices=by_time, settled_receipt_id=None))) == (
        "HOLD_DUNNING_AFTER_RECOVERY",)


def test_pure_override_incomplete():
    exc = grace_cycle(state="EXCEPTION_ACTIVE", suspended_state="GRACE_ACTIVE", next_attempt_at=None,
                      exception_owner="agent", exception_ticket="SUP-1", exception_reason="goodwill",
                      exception_expires_at=T0 + 3 * DAY, exception_profile="FULL")
    ok = {"entitlement_profile": "FULL", "expected_profile": "FULL"}
    assert codes(review_of(exc, **ok)) == ()
    verdict = evaluate(review_of(replace(exc, exception_owner="", exception_ticket="", exception_expires_at=None),
                                 **ok))
    assert verdict.codes == ("HOLD_OVERRIDE_INCOMPLETE",)
    assert "owner, ticket reference or expiry" in verdict.blockers[0].detail


def test_pure_policy_not_transferred():
    copied = grace_cycle(policy=NO_GRACE, state="RESTRICTED", next_attempt_at=None, attempts_made=1)
    annual = {"policy": NO_GRACE, "price_id": "price_annual_pro", "billing_interval": "year",
              "entitlement_profile": "SUSPENDED", "expected_profile": "SUSPENDED"}
    assert codes(review_of(copied, **annual)) == ("HOLD_POLICY_NOT_TRANSFERRED",)
    assert codes(review_of(replace(copied, grace_expires_at=T0), **annual)) == ()
    # Bound to a policy that does not list the price and is not the default.
    assert codes(review_of(grace_cycle(), price_id="price_annual_pro")) == ("HOLD_POLICY_NOT_TRANSFERRED",)
    catch_all = replace(MONTHLY, prices=(), is_default=True)
    assert codes(review_of(grace_cycle(), price_id="price_other", policy=catch_all)) == ()


def test_pure_missing_policy_version():
    assert codes(review_of(grace_cycle(policy=None))) == ("HOLD_MISSING_POLICY_VERSION",)
    unversioned = replace(MONTHLY, identity="seed002-monthly")
    assert codes(review_of(grace_cycle(policy=unversioned))) == ("HOLD_MISSING_POLICY_VERSION",)
    assert codes(review_of(grace_cycle(), policy=None)) == ("HOLD_MISSING_POLICY_VERSION",)
    assert codes(review_of(grace_cycle(), policy=replace(MONTHLY, identity=None))) == (
        "HOLD_MISSING_POLICY_VERSION",)


def test_pure_missing_audit_ref():
    assert codes(review_of(grace_cycle(audit_ref=None))) == ("HOLD_MISSING_AUDIT_REF",)
    assert codes(review_of(grace_cycle(state="RECOVERED", next_attempt_at=None, audit_ref=None),
                           entitlement_profile="FULL", expected_profile="FULL")) == ("HOLD_MISSING_AUDIT_REF",)


def test_pure_evidence_conflict_and_unknown_state():
    conflict = grace_cycle(state="EVIDENCE_CONFLICT", next_attempt_at=None)
    assert codes(review_of(conflict)) == ("HOLD_EVIDENCE_CONFLICT",)
    assert codes(review_of(grace_cycle(state="LIMBO"))) == ("HOLD_UNKNOWN_CYCLE_STATE",)


def test_pure_blockers_are_ordered_stably_and_name_their_cycle():
    a = grace_cycle(cycle_id="c-a", failure_class="NON_RETRYABLE", audit_ref=None)
    b = grace_cycle(cycle_id="c-b", attempts_made=9, policy=None)
    one = evaluate(review_of(a, b))
    assert evaluate(review_of(b, a)) == one
    assert [(x.code, x.cycle_id) for x in one.blockers] == [
        ("HOLD_MISSING_POLICY_VERSION", "c-b"),
        ("HOLD_MISSING_AUDIT_REF", "c-a"),
        ("HOLD_NONRETRYABLE_RETRY_CONFLICT", "c-a"),
        ("HOLD_ATTEMPTS_OVER_BUDGET", "c-b"),  # judged against the subscription's policy as a fallback
    ]
    assert all(f"cycle {x.cycle_id}" in x.detail for x in one.blockers)
    assert one.as_dict()["status"] == HOLD and one.as_dict()["blockers"][0]["cycle"] == "c-b"


def test_pure_odd_input_holds_instead_of_raising():
    assert evaluate(None).codes == ("HOLD_REVIEW_INPUT_INVALID",)  # type: ignore[arg-type]
    assert evaluate(review_of(grace_cycle(), now=None)).codes == ("HOLD_REVIEW_INPUT_INVALID",)  # type: ignore
    naive = grace_cycle(grace_expires_at=datetime(2026, 3, 8), grace_started_at=T0)
    assert "HOLD_REVIEW_INPUT_INVALID" in evaluate(review_of(naive, entitlement_profile="FULL")).codes
    assert evaluate(review_of("not a cycle")).codes == ("HOLD_REVIEW_INPUT_INVALID",)  # type: ignore[arg-type]
    assert evaluate(review_of(grace_cycle(state=["GRACE_ACTIVE"]))).codes == ("HOLD_REVIEW_INPUT_INVALID",)


_anything = st.one_of(st.none(), st.booleans(), st.integers(-3, 5), st.text(max_size=4),
                      st.datetimes(), st.datetimes(timezones=st.just(UTC)), st.timedeltas())
_when = st.one_of(st.none(), st.datetimes(timezones=st.just(UTC)), st.datetimes())
_states = st.one_of(st.sampled_from(sorted(v.KNOWN_STATES)), _anything)
_policies = st.one_of(st.none(), st.just(MONTHLY), st.just(NO_GRACE), st.builds(
    PolicyFacts, identity=st.one_of(st.none(), st.text(max_size=8), st.just("x@1")), has_grace=_anything,
    grace_duration=_anything, grace_profile=_anything, restricted_profile=_anything, max_attempts=_anything,
    retry_authority=_anything, prices=st.one_of(st.tuples(st.text(max_size=3)), _anything),
    is_default=_anything))
_notices = st.lists(st.builds(Notice, template=_anything, requested_at=_when, receipt_id=_anything), max_size=3)
_cycles = st.builds(
    CycleReview, cycle_id=_anything, state=_states, policy=_policies,
    failure_class=st.one_of(st.sampled_from(["RETRYABLE", "NON_RETRYABLE", "CUSTOMER_ACTION"]), _anything),
    customer_action_required=_anything, next_attempt_at=_when, attempts_made=_anything, grace_started_at=_when,
    grace_expires_at=_when, exception_owner=_anything, exception_ticket=_anything, exception_reason=_anything,
    exception_expires_at=_when, exception_profile=_anything, suspended_state=_states, settled_at=_when,
    settled_receipt_id=_anything, audit_ref=_anything, notices=st.one_of(_notices.map(tuple), _anything),
)


@settings(max_examples=300, deadline=None)
@given(cycles=st.lists(_cycles, max_size=4), policy=_policies, now=_when,
       profile=st.one_of(st.sampled_from(["FULL", "LIMITED", "SUSPENDED"]), _anything),
       expected=st.one_of(st.none(), st.sampled_from(["FULL", "LIMITED"])), enforces=_anything)
def test_pure_evaluator_is_total_and_deterministic(cycles, policy, now, profile, expected, enforces):
    review = SubscriptionReview(subscription_id="s", billing_interval="month", price_id=SEED_PRICE,
                                entitlement_profile=profile, policy=policy, now=now, cycles=tuple(cycles),
                                expected_profile=expected, enforces_access=enforces)
    verdict = evaluate(review)
    assert verdict.status in (READY, HOLD)
    assert (verdict.status == HOLD) == bool(verdict.blockers)
    assert all(b.code in v.BLOCKER_CODES and isinstance(b.detail, str) and b.detail for b in verdict.blockers)
    assert evaluate(review) == verdict
    assert evaluate(replace(review, cycles=tuple(reversed(cycles)))) == verdict


# --- the evaluator stays pure and in step with the model's states -----------------------------------

def test_evaluator_imports_no_django():
    code = "import sys, dunning.reads.verdicts; print(sorted(m for m in sys.modules if m.split('.')[0] == 'django'))"
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.strip() == "[]"


def test_evaluator_state_names_match_the_model():
    def values(states) -> set[str]:
        return {s.value if hasattr(s, "value") else s for s in states}

    assert values(model_states.CycleState) == v.KNOWN_STATES
    assert values(model_states.DELINQUENT_STATES) == v.DELINQUENT_STATES
    assert values(model_states.CycleState) - values(model_states.OPEN_STATES) - values(
        model_states.TERMINAL_STATES) | {"CLOSED_VOID"} == v.SETTLED_STATES
    assert values(model_states.NO_RETRY_CLASSES) == v.NO_RETRY_CLASSES
    assert values(model_states.GRACE_PROFILE_STATES) - {"PAYMENT_FAILED"} <= v.IN_GRACE_STATES | v.POST_GRACE_STATES
    assert values(model_states.EXCEPTION_SOURCE_STATES) <= v.GRACE_STARTED_STATES
