"""Every edge of SPEC §5 accepted along a path, and every guard refusing with its reason."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django_fsm import ConcurrentTransition, TransitionNotAllowed

from dunning.acceptance.inputs import Cause, Evidence, FactSpec, InvoiceUpdate
from dunning.acceptance_scope import acceptance_scope
from dunning.models import DunningCycle, OutboxMessage, PaymentAttempt, TransitionReceipt
from dunning.states import AttemptState, CycleState
from entitlements.models import EntitlementSnapshot
from tests.support.builders import (
    accept,
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

S = CycleState


@pytest.fixture
def policies(db):
    return {"provider": make_policy(), "local": local_policy()}


def walker(policies, staff, state: str) -> Walker:
    price = "price_local" if state in LOCAL_ONLY else "price_test"
    cycle = open_cycle(make_subscription(price=price))
    return Walker(cycle, staff=staff)


@pytest.mark.parametrize("state", list(PATH_TO))
def test_every_state_is_reachable_through_accepted_edges(policies, staff, state):
    w = walker(policies, staff, state)
    PATH_TO[state](w)
    assert reload(w.cycle).state == state
    receipts = TransitionReceipt.objects.filter(cycle=w.cycle)
    assert receipts.filter(accepted=False).count() == 0
    assert all(r.root_after == reload(w.cycle).subscription.outstanding_cycle_root
               for r in receipts.order_by("-id")[:1])


def test_provider_reschedule_updates_next_attempt_as_evidence(policies, staff):
    w = walker(policies, staff, "RETRY_SCHEDULED").to_retry_scheduled()
    later = w.now + timedelta(days=3)
    w.step("reschedule_retry", next_attempt_at=later)
    assert w.cycle.state == S.RETRY_SCHEDULED and w.cycle.next_attempt_at == later


def test_retry_failed_returns_to_grace(policies, staff):
    w = walker(policies, staff, "RETRY_FAILED").to_retry_failed()
    w.step("return_to_grace")
    assert w.cycle.state == S.GRACE_ACTIVE


def test_local_retry_persists_key_before_dispatch_and_failure_resolves_same_attempt(policies, staff):
    w = walker(policies, staff, "RETRY_DISPATCHING").to_dispatching()
    attempt = w.cycle.pending_attempt
    assert attempt.state == AttemptState.DISPATCHING and attempt.idempotency_key.endswith("attempt-2")
    w.step("retry_failed", decline_code="insufficient_funds")
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.FAILED and w.cycle.pending_attempt is None
    assert w.cycle.retry_budget_used == 1


def test_unknown_payment_gets_owner_and_resolves_onto_same_attempt(policies, staff):
    w = walker(policies, staff, "PAYMENT_UNKNOWN").to_unknown()
    attempt_id = w.cycle.pending_attempt.operation_id
    w.step("assign_unknown_owner", owner=staff)
    assert w.cycle.unknown_owner == staff
    w.step("recover", evidence=paid_evidence(w.cycle, now=w.now))
    attempt = PaymentAttempt.objects.get(operation_id=attempt_id)
    assert attempt.state == AttemptState.SUCCEEDED
    assert PaymentAttempt.objects.filter(cycle=w.cycle, origin="LOCAL").count() == 1


def test_unknown_resolved_as_failed_keeps_the_attempt(policies, staff):
    w = walker(policies, staff, "PAYMENT_UNKNOWN").to_unknown()
    attempt_id = w.cycle.pending_attempt.operation_id
    w.step("retry_failed", decline_code="insufficient_funds")
    assert PaymentAttempt.objects.get(operation_id=attempt_id).state == AttemptState.FAILED
    assert w.cycle.state == S.RETRY_FAILED


@pytest.mark.parametrize("back_to", ["GRACE_ACTIVE", "GRACE_EXPIRED", "RESTRICTED"])
def test_exception_returns_to_the_state_it_suspended(policies, staff, back_to):
    w = walker(policies, staff, back_to)
    PATH_TO[back_to](w)
    w.step("grant_exception", cause=w.staff_cause(), expires_at=w.now + timedelta(days=2), profile="FULL")
    assert w.cycle.state == S.EXCEPTION_ACTIVE and w.cycle.subscription.entitlement_profile == "FULL"
    w.advance(timedelta(days=2, seconds=1))
    w.step("expire_exception")
    assert w.cycle.state == back_to


@pytest.mark.parametrize("resolution,status", [("RECOVERED", "paid"), ("CLOSED_VOID", "void"),
                                               ("GRACE_ACTIVE", "open"), ("RESTRICTED", "open")])
def test_conflict_leaves_only_by_support_decision(policies, staff, resolution, status):
    w = walker(policies, staff, "EVIDENCE_CONFLICT").to_conflict()
    refused = accept(w.cycle, "recover", evidence=paid_evidence(w.cycle, now=w.now), now=w.now)
    assert not refused and refused.reason == "EDGE_NOT_ALLOWED"
    w.step("resolve_conflict", cause=w.staff_cause(), resolution=resolution,
           evidence=Evidence(receipt=invoice_receipt(w.cycle, status, fetched_at=w.now)))
    assert w.cycle.state == resolution


def test_conflict_holds_access_in_both_directions(policies, staff):
    w = walker(policies, staff, "EVIDENCE_CONFLICT").to_conflict()
    held = w.cycle.subscription.entitlement_profile
    assert held == "READ_EXPORT_NO_NEW_JOBS"
    other = open_cycle(w.cycle.subscription)
    Walker(other, now=w.now).to_recovered()
    assert reload(w.cycle).subscription.entitlement_profile == held


def test_lost_dispute_reopens_recovered_debt(policies, staff):
    w = walker(policies, staff, "RECOVERED").to_recovered()
    assert w.cycle.subscription.entitlement_profile == "FULL"
    inv = w.cycle.invoice
    dispute = Evidence(facts=(FactSpec(kind="DISPUTE_LOST", amount=inv.amount_due, currency=inv.currency,
                                       dedupe_key=f"dispute_lost:{inv.provider_invoice_id}", occurred_at=w.now),))
    w.step("reopen_after_dispute", evidence=dispute)
    assert w.cycle.state == S.PAYMENT_FAILED and w.cycle.dispute_reopened
    assert w.cycle.subscription.entitlement_profile == "READ_EXPORT_NO_NEW_JOBS"


def test_record_evidence_changes_no_state_but_bumps_revision(policies, staff):
    w = walker(policies, staff, "GRACE_ACTIVE").to_grace()
    before = (w.cycle.state, w.cycle.invoice.revision)
    inv = w.cycle.invoice
    w.step("record_evidence", evidence=Evidence(
        receipt=invoice_receipt(w.cycle, "open", fetched_at=w.now),
        invoice=InvoiceUpdate(status="open", amount_due=inv.amount_due, amount_paid=0, attempt_count=2,
                              next_payment_attempt=w.now + timedelta(days=2))))
    assert w.cycle.state == before[0] and w.cycle.invoice.revision == before[1] + 1


# ---------------------------------------------------------------- refusals

def _counts():
    return (EntitlementSnapshot.objects.count(), OutboxMessage.objects.count(),
            TransitionReceipt.objects.filter(accepted=True).count())


def assert_refused(w: Walker, edge: str, reason: str, **kwargs):
    before_cycle = reload(w.cycle)
    before = _counts()
    result = accept(w.cycle, edge, now=kwargs.pop("now", w.now), **kwargs)
    assert not result.accepted
    assert result.reason == reason, f"{result.reason}: {result.detail}"
    after_cycle = reload(w.cycle)
    assert (after_cycle.state, after_cycle.generation, after_cycle.invoice.revision) == (
        before_cycle.state, before_cycle.generation, before_cycle.invoice.revision)
    assert _counts() == before
    rejection = TransitionReceipt.objects.get(pk=result.receipt_id)
    assert rejection.accepted is False and rejection.rejection_reason == reason and rejection.edge == edge
    return result


def test_edge_not_from_this_state(policies, staff):
    w = walker(policies, staff, "CURRENT")
    assert_refused(w, "expire_grace", "EDGE_NOT_ALLOWED")


@pytest.mark.parametrize("terminal", ["CANCELED", "CLOSED_VOID"])
def test_terminal_states_are_immutable(policies, staff, terminal):
    w = walker(policies, staff, terminal)
    PATH_TO[terminal](w)
    assert_refused(w, "recover", "EDGE_NOT_ALLOWED", evidence=paid_evidence(w.cycle, now=w.now))
    assert_refused(w, "flag_conflict", "EDGE_NOT_ALLOWED", conflict_reason="late failure")


def test_grace_not_expired_before_the_trusted_clock_passes_it(policies, staff):
    w = walker(policies, staff, "GRACE_ACTIVE").to_grace()
    assert_refused(w, "expire_grace", "GRACE_NOT_EXPIRED", now=w.cycle.grace_expires_at - timedelta(seconds=1))


@pytest.mark.parametrize("make_evidence,reason", [
    (lambda w: None, "FRESH_RECEIPT_REQUIRED"),
    (lambda w: unpaid_evidence(w.cycle, now=w.now - timedelta(minutes=6)), "RECEIPT_NOT_FRESH"),
    (lambda w: paid_evidence(w.cycle, now=w.now), "INVOICE_NOT_UNPAID"),
    (lambda w: unpaid_evidence(w.cycle, now=w.now, status="void"), "INVOICE_NOT_UNPAID"),
])
def test_restriction_needs_a_fresh_unpaid_receipt(policies, staff, make_evidence, reason):
    w = walker(policies, staff, "GRACE_EXPIRED").to_grace_expired()
    assert_refused(w, "begin_restriction", reason, evidence=make_evidence(w))


def test_receipt_for_another_invoice_is_refused(policies, staff):
    w = walker(policies, staff, "GRACE_EXPIRED").to_grace_expired()
    other = open_cycle(w.cycle.subscription)
    assert_refused(w, "begin_restriction", "RECEIPT_NOT_FOR_THIS_INVOICE",
                   evidence=unpaid_evidence(other, now=w.now))


def test_cancellation_needs_fresh_unpaid_receipt(policies, staff):
    w = walker(policies, staff, "CANCEL_PENDING").to_cancel_pending()
    assert_refused(w, "cancel", "FRESH_RECEIPT_REQUIRED")
    assert_refused(w, "cancel", "INVOICE_NOT_UNPAID", evidence=paid_evidence(w.cycle, now=w.now))


def test_cancellation_not_due_before_restricted_period(policies, staff):
    w = walker(policies, staff, "RESTRICTED").to_restricted()
    assert_refused(w, "request_cancellation", "CANCEL_NOT_DUE", now=w.now + timedelta(days=29))


def test_recover_and_void_need_matching_receipts(policies, staff):
    w = walker(policies, staff, "GRACE_ACTIVE").to_grace()
    assert_refused(w, "recover", "INVOICE_NOT_PAID", evidence=unpaid_evidence(w.cycle, now=w.now))
    assert_refused(w, "close_void", "INVOICE_NOT_VOID", evidence=unpaid_evidence(w.cycle, now=w.now))


def test_non_retryable_failure_is_never_scheduled(policies, staff):
    w = walker(policies, staff, "GRACE_ACTIVE").to_grace(decline_code="stolen_card")
    assert w.cycle.customer_action_required and w.cycle.next_attempt_at is None
    assert_refused(w, "schedule_retry", "NON_RETRYABLE_NO_RETRY", next_attempt_at=w.now + timedelta(days=1))


def test_attempt_budget_bounds_retries(policies, staff):
    w = walker(policies, staff, "GRACE_ACTIVE").to_grace()
    inv = w.cycle.invoice
    w.step("record_evidence", evidence=Evidence(invoice=InvoiceUpdate(
        status="open", amount_due=inv.amount_due, amount_paid=0, attempt_count=4, next_payment_attempt=None)))
    assert_refused(w, "schedule_retry", "ATTEMPT_BUDGET_EXHAUSTED", next_attempt_at=w.now + timedelta(days=1))


def test_provider_retry_needs_provider_next_attempt(policies, staff):
    w = walker(policies, staff, "GRACE_ACTIVE").to_grace()
    assert_refused(w, "schedule_retry", "MISSING_NEXT_ATTEMPT")


def test_retry_authority_is_exclusive(policies, staff):
    w = walker(policies, staff, "RETRY_SCHEDULED").to_retry_scheduled()
    assert_refused(w, "prepare_retry", "RETRY_AUTHORITY_IS_PROVIDER")
    local = Walker(open_cycle(make_subscription(price="price_local")), staff=staff).to_grace()
    local.step("schedule_retry")
    assert_refused(local, "reschedule_retry", "RETRY_AUTHORITY_IS_LOCAL", next_attempt_at=local.now)
    assert_refused(local, "dispatch_retry", "NO_PREPARED_ATTEMPT")
    assert_refused(local, "retry_failed", "NOT_DISPATCHED")
    local.step("prepare_retry")
    assert_refused(local, "prepare_retry", "ATTEMPT_PENDING")


def test_exception_rules(policies, staff):
    w = walker(policies, staff, "RESTRICTED").to_restricted()
    assert_refused(w, "grant_exception", "MANUAL_DECISION_REQUIRED", expires_at=w.now + timedelta(days=1))
    assert_refused(w, "grant_exception", "REASON_AND_TICKET_REQUIRED",
                   cause=w.staff_cause(ticket=" "), expires_at=w.now + timedelta(days=1))
    assert_refused(w, "grant_exception", "EXCEPTION_TOO_LONG",
                   cause=w.staff_cause(), expires_at=w.now + timedelta(days=15))
    assert_refused(w, "grant_exception", "EXCEPTION_EXPIRY_NOT_IN_FUTURE",
                   cause=w.staff_cause(), expires_at=w.now - timedelta(minutes=1))
    assert_refused(w, "grant_exception", "MISSING_PARAMETER", cause=w.staff_cause())
    w.step("grant_exception", cause=w.staff_cause(), expires_at=w.now + timedelta(days=1))
    assert_refused(w, "expire_exception", "EXCEPTION_NOT_EXPIRED")


def test_conflict_resolution_must_agree_with_fresh_receipt(policies, staff):
    w = walker(policies, staff, "EVIDENCE_CONFLICT").to_conflict()
    assert_refused(w, "resolve_conflict", "MANUAL_DECISION_REQUIRED", resolution="RECOVERED",
                   evidence=paid_evidence(w.cycle, now=w.now))
    assert_refused(w, "resolve_conflict", "RESOLUTION_CONTRADICTS_RECEIPT", cause=w.staff_cause(),
                   resolution="RECOVERED", evidence=unpaid_evidence(w.cycle, now=w.now))
    assert_refused(w, "resolve_conflict", "UNKNOWN_RESOLUTION", cause=w.staff_cause(), resolution="CANCELED",
                   evidence=unpaid_evidence(w.cycle, now=w.now))


def test_dispute_reopen_needs_the_fact_and_a_blocking_policy(policies, staff):
    w = walker(policies, staff, "RECOVERED").to_recovered()
    assert_refused(w, "reopen_after_dispute", "DISPUTE_LOST_FACT_REQUIRED")
    lenient = make_policy(policy="lenient@1", dispute_lost="CLOSED", applies_to={"prices": ["price_lenient"]})
    assert lenient.spec.dispute_lost == "CLOSED"
    w2 = Walker(open_cycle(make_subscription(price="price_lenient"))).to_recovered()
    assert_refused(w2, "reopen_after_dispute", "DISPUTE_LOST_NOT_BLOCKING")


def test_unknown_owner_required(policies, staff):
    w = walker(policies, staff, "PAYMENT_UNKNOWN").to_unknown()
    assert_refused(w, "assign_unknown_owner", "OWNER_REQUIRED", owner=None)


# ---------------------------------------------------------------- protection

def test_state_field_cannot_be_assigned(policies):
    cycle = DunningCycle.objects.get(pk=open_cycle(make_subscription()).pk)
    with pytest.raises(AttributeError):
        cycle.state = S.RECOVERED


def test_transitions_refuse_outside_the_acceptance_service(policies):
    cycle = DunningCycle.objects.get(pk=open_cycle(make_subscription()).pk)
    with pytest.raises(TransitionNotAllowed):
        cycle.record_failure(failure_class="RETRYABLE", decline_code="", no_retry=False)
    with acceptance_scope():
        cycle.record_failure(failure_class="RETRYABLE", decline_code="", no_retry=False)
    assert cycle.state == S.PAYMENT_FAILED


def test_stale_instance_cannot_save_even_in_the_same_state(policies):
    w = Walker(open_cycle(make_subscription())).to_grace()
    stale = DunningCycle.objects.get(pk=w.cycle.pk)
    inv = w.cycle.invoice
    w.step("record_evidence", evidence=Evidence(invoice=InvoiceUpdate(
        status="open", amount_due=inv.amount_due, amount_paid=0, attempt_count=2, next_payment_attempt=None)))
    assert reload(w.cycle).state == stale.state and reload(w.cycle).generation == stale.generation + 1
    with acceptance_scope():
        stale.expire_grace()
    with pytest.raises(ConcurrentTransition, match="generation moved"):
        stale.save()


def test_unknown_edge_is_a_programming_error(policies):
    cycle = open_cycle(make_subscription())
    with pytest.raises(ValueError, match="unknown edge"):
        accept(cycle, "teleport")


def test_staff_cause_carries_the_user(policies, staff):
    w = walker(policies, staff, "RESTRICTED").to_restricted()
    result = w.step("grant_exception", cause=w.staff_cause(reason="hospital stay", ticket="SUP-77"),
                    expires_at=w.now + timedelta(days=5))
    receipt = TransitionReceipt.objects.get(pk=result.receipt_id)
    assert (receipt.actor_user, receipt.reason, receipt.ticket, receipt.cause_kind) == (
        staff, "hospital stay", "SUP-77", "USER")
    assert Cause.system("x").kind == "SYSTEM"
