"""The manual compensation queue on PostgreSQL: cases opened from alerts and reconciliation
findings (idempotently), taken by billing leads, and resolved through the real services."""

from __future__ import annotations

from datetime import timedelta

import pytest

from dunning.actions.alerts import alert_raise
from dunning.actions.compensation import CompensationRefused, compensation_resolve, compensation_take
from dunning.append_only import AppendOnlyViolation
from dunning.clock import trusted_now
from dunning.jobs.framework import job_run
from dunning.models import AlertKind, ReconciliationReport, TransitionReceipt
from dunning.models.duties import CompensationAction, CompensationCase, CompensationKind, CompensationState
from subscriptions.models import Subscription
from tests.duties.conftest import open_case
from tests.support.builders import make_subscription, restrict

pytestmark = pytest.mark.django_db
K = CompensationKind


def paid_not_restored_alert(scene):  # noqa: ANN001, ANN201
    invoice = scene.cycle.invoice
    return alert_raise(kind=AlertKind.PAID_NOT_RESTORED, dedupe_key=f"paid_not_restored:{invoice.provider_invoice_id}",
                       detail=f"Invoice {invoice.provider_invoice_id} was paid but access is not restored.",
                       figures={"provider_invoice_id": invoice.provider_invoice_id}, now=trusted_now(),
                       subscription=scene.sub, invoice=invoice)


def report_with(*findings: dict) -> ReconciliationReport:
    now = trusted_now()
    return ReconciliationReport.objects.create(run_for=now, window_start=now - timedelta(days=1), window_end=now,
                                               created_at=now, totals={}, discrepancies=list(findings))


def snapshot(case: CompensationCase) -> tuple:
    case.refresh_from_db()
    return (case.state, case.owner_id, case.resolution, case.reason, case.ticket, case.resolved_at,
            case.actions.count(), TransitionReceipt.objects.count())


# --------------------------------------------------------------------------- opening


def test_an_alert_opens_one_case_and_a_rerun_opens_nothing(grace_scene):
    alert = paid_not_restored_alert(grace_scene)
    run = job_run("compensation_intake")
    assert run.changed == 1
    case = CompensationCase.objects.get()
    assert (case.kind, case.subscription_id, case.invoice_id, case.cycle_id, case.source_alert_id, case.state) == (
        K.PAID_NOT_ENTITLED, grace_scene.sub.pk, grace_scene.cycle.invoice_id, grace_scene.cycle.pk, alert.pk,
        CompensationState.OPEN)
    assert list(case.actions.values_list("action", "actor")) == [("OPEN", "job:compensation_intake")]

    again = job_run("compensation_intake")
    assert again.changed == 0
    case.refresh_from_db()
    assert (CompensationCase.objects.count(), case.sightings, case.actions.count()) == (1, 1, 1)


def test_a_second_source_for_the_same_mismatch_is_a_sighting_not_a_second_case(grace_scene):
    paid_not_restored_alert(grace_scene)
    job_run("compensation_intake")
    report_with({"kind": "PAID_BUT_CYCLE_OPEN", "subscription": grace_scene.sub.pk,
                 "invoice": grace_scene.cycle.invoice_id, "detail": "paid at the provider, cycle GRACE_ACTIVE"})
    job_run("compensation_intake")
    case = CompensationCase.objects.get()
    assert case.sightings == 2
    assert list(case.actions.values_list("action", flat=True).order_by("pk")) == ["OPEN", "SEEN_AGAIN"]


def test_reconciliation_findings_open_cases_by_direction(grace_scene, policy):

    other = make_subscription()
    report = report_with(
        {"kind": "ENTITLEMENT_MISMATCH", "subscription": grace_scene.sub.pk, "stored_profile": "FULL",
         "recomputed_profile": "READ_EXPORT_NO_NEW_JOBS", "detail": "holds FULL, cycles call for less"},
        {"kind": "LOCAL_PAID_PROVIDER_NOT_PAID", "subscription": grace_scene.sub.pk, "detail": "dup of the above"},
        {"kind": "ENTITLEMENT_MISMATCH", "subscription": other.pk, "stored_profile": "SUSPENDED",
         "recomputed_profile": "FULL", "detail": "holds SUSPENDED, cycles call for FULL"},
        {"kind": "EVENT_MISSING_FROM_INBOX", "event_id": "evt_1", "detail": "not a money/access mismatch"},
        {"kind": "ROOT_MISMATCH", "subscription": other.pk, "detail": "not one of the two kinds"},
    )
    run = job_run("compensation_intake")
    assert run.changed == 2
    cases = {(c.subscription_id, c.kind): c for c in CompensationCase.objects.all()}
    assert set(cases) == {(grace_scene.sub.pk, K.ENTITLED_NOT_PAID), (other.pk, K.PAID_NOT_ENTITLED)}
    assert all(c.source_report_id == report.pk for c in cases.values())
    assert cases[(other.pk, K.PAID_NOT_ENTITLED)].source_finding["recomputed_profile"] == "FULL"


def test_a_resolved_case_is_not_reopened_by_the_report_that_opened_it(grace_scene, lead):
    report_with({"kind": "PROVIDER_PAID_NO_LOCAL_FACT", "subscription": grace_scene.sub.pk,
                 "invoice": grace_scene.cycle.invoice_id, "detail": "paid, no fact"})
    job_run("compensation_intake")
    case = CompensationCase.objects.get()
    compensation_take(case_pk=case.pk, user=lead)
    compensation_resolve(case_pk=case.pk, user=lead, resolution="EXPLAINED", reason="test charge", ticket="SUP-1")
    job_run("compensation_intake")
    assert CompensationCase.objects.count() == 1
    # A new source (a new alert) after the resolution is a new episode: a new case.
    paid_not_restored_alert(grace_scene)
    job_run("compensation_intake")
    assert CompensationCase.objects.filter(state=CompensationState.OPEN).count() == 1
    assert CompensationCase.objects.count() == 2


# --------------------------------------------------------------------------- ownership


def test_only_a_billing_lead_takes_a_case_and_a_lead_may_take_it_over(grace_scene, lead, lead2, agent):
    case = open_case(grace_scene)
    before = snapshot(case)
    with pytest.raises(CompensationRefused) as refused:
        compensation_take(case_pk=case.pk, user=agent)
    assert refused.value.code == "NOT_A_BILLING_LEAD"
    assert snapshot(case) == before

    decision = compensation_take(case_pk=case.pk, user=lead)
    assert (decision.case.state, decision.case.owner_id) == (CompensationState.OWNED, lead.pk)
    assert compensation_take(case_pk=case.pk, user=lead).action is None  # already owned: nothing written
    decision = compensation_take(case_pk=case.pk, user=lead2)
    assert decision.case.owner_id == lead2.pk and "taken over from lead" in decision.action.outcome
    assert list(case.actions.values_list("action", "actor").order_by("pk")) == [
        ("OPEN", "job:compensation_intake"), ("TAKE", "lead"), ("TAKE", "lead2")]


# --------------------------------------------------------------------------- resolutions through the services


def test_refetch_and_reapply_recovers_the_cycle_from_the_providers_truth(grace_scene, lead, provider_says):
    fake = provider_says("paid")
    case = open_case(grace_scene)
    compensation_take(case_pk=case.pk, user=lead)
    decision = compensation_resolve(case_pk=case.pk, user=lead, resolution="REFETCH_AND_REAPPLY",
                                    reason="customer paid by card on the 2nd", ticket="SUP-42")
    scene = grace_scene.fresh()
    assert fake.fetches == 1
    assert scene.cycle.state == "RECOVERED" and scene.sub.entitlement_profile == "FULL"
    assert decision.case.state == CompensationState.RESOLVED and decision.case.resolved_by_id == lead.pk
    receipts = TransitionReceipt.objects.filter(pk__in=decision.action.receipt_ids)
    assert {r.edge for r in receipts} >= {"recover", "contract_recheck"}
    assert all(r.cause_ref == "SUP-42" for r in receipts)
    assert "Access recomputed: FULL" in decision.text


def test_refetch_when_the_provider_does_not_answer_changes_nothing(grace_scene, lead):
    case = open_case(grace_scene)
    compensation_take(case_pk=case.pk, user=lead)
    before = snapshot(case)
    with pytest.raises(CompensationRefused) as refused:
        compensation_resolve(case_pk=case.pk, user=lead, resolution="REFETCH_AND_REAPPLY", reason="r", ticket="t")
    assert refused.value.code == "PROVIDER_UNAVAILABLE"
    assert snapshot(case) == before
    assert grace_scene.fresh().cycle.state == "GRACE_ACTIVE"


def test_recompute_access_restricts_a_customer_entitled_but_not_paid(grace_scene, lead):
    restrict(grace_scene.cycle)
    # The drift reconciliation reports: the subscription holds FULL although its cycle is RESTRICTED.
    Subscription.objects.filter(pk=grace_scene.sub.pk).update(entitlement_profile="FULL")
    case = open_case(grace_scene, K.ENTITLED_NOT_PAID)
    compensation_take(case_pk=case.pk, user=lead)
    decision = compensation_resolve(case_pk=case.pk, user=lead, resolution="RECOMPUTE_ACCESS",
                                    reason="reconciliation: FULL while restricted", ticket="OPS-7")
    assert Subscription.objects.get(pk=grace_scene.sub.pk).entitlement_profile == "SUSPENDED"
    assert TransitionReceipt.objects.get(pk=decision.action.receipt_ids[0]).edge == "contract_recheck"


def test_grant_exception_restores_access_for_a_bounded_time(grace_scene, lead):
    case = open_case(grace_scene)
    compensation_take(case_pk=case.pk, user=lead)
    until = trusted_now() + timedelta(days=3)
    decision = compensation_resolve(case_pk=case.pk, user=lead, resolution="GRANT_EXCEPTION", reason="bank transfer",
                                    ticket="SUP-9", exception_expires_at=until)
    scene = grace_scene.fresh()
    assert scene.cycle.state == "EXCEPTION_ACTIVE" and scene.sub.entitlement_profile == "FULL"
    assert scene.cycle.exception_ticket == "SUP-9"
    assert decision.case.resolution == "GRANT_EXCEPTION"


def test_a_service_refusal_leaves_the_case_open(grace_scene, lead):
    case = open_case(grace_scene)
    compensation_take(case_pk=case.pk, user=lead)
    before = snapshot(case)
    with pytest.raises(CompensationRefused) as refused:
        compensation_resolve(case_pk=case.pk, user=lead, resolution="GRANT_EXCEPTION", reason="r", ticket="t",
                             exception_expires_at=trusted_now() + timedelta(days=400))
    assert refused.value.code == "EXCEPTION_TOO_LONG"
    after = snapshot(case)
    assert after[:-1] == before[:-1]  # the case and its trail are untouched...
    assert after[-1] == before[-1] + 1  # ...the acceptance service recorded its rejection, as it always does
    assert grace_scene.fresh().cycle.state == "GRACE_ACTIVE"


def test_explained_changes_no_state(grace_scene, lead):
    case = open_case(grace_scene)
    compensation_take(case_pk=case.pk, user=lead)
    receipts = TransitionReceipt.objects.count()
    decision = compensation_resolve(case_pk=case.pk, user=lead, resolution="EXPLAINED",
                                    reason="provider test invoice", ticket="SUP-3")
    assert decision.case.state == CompensationState.RESOLVED and decision.action.outcome == "No change: explained."
    assert TransitionReceipt.objects.count() == receipts
    assert grace_scene.fresh().sub.entitlement_profile == "READ_EXPORT_NO_NEW_JOBS"


# --------------------------------------------------------------------------- refusals of bad input


@pytest.mark.parametrize(("resolution", "reason", "ticket", "extra", "code"), [
    ("REFUND_EVERYTHING", "r", "t", {}, "UNKNOWN_RESOLUTION"),
    ("EXPLAINED", "  ", "t", {}, "REASON_REQUIRED"),
    ("EXPLAINED", "r", "", {}, "TICKET_REQUIRED"),
    ("GRANT_EXCEPTION", "r", "t", {}, "EXPIRY_REQUIRED"),
])
def test_bad_input_is_refused_with_a_code_and_changes_nothing(grace_scene, lead, resolution, reason, ticket, extra,
                                                              code):
    case = open_case(grace_scene)
    compensation_take(case_pk=case.pk, user=lead)
    before = snapshot(case)
    with pytest.raises(CompensationRefused) as refused:
        compensation_resolve(case_pk=case.pk, user=lead, resolution=resolution, reason=reason, ticket=ticket, **extra)
    assert refused.value.code == code and refused.value.detail
    assert snapshot(case) == before


def test_who_may_resolve_and_what_fits_the_case(grace_scene, lead, lead2, agent):
    case = open_case(grace_scene, K.ENTITLED_NOT_PAID)
    before = snapshot(case)
    for user, code in ((agent, "NOT_A_BILLING_LEAD"), (lead, "NOT_THE_OWNER")):
        with pytest.raises(CompensationRefused) as refused:
            compensation_resolve(case_pk=case.pk, user=user, resolution="EXPLAINED", reason="r", ticket="t")
        assert refused.value.code == code
    assert snapshot(case) == before
    compensation_take(case_pk=case.pk, user=lead)
    with pytest.raises(CompensationRefused) as refused:
        compensation_resolve(case_pk=case.pk, user=lead, resolution="GRANT_EXCEPTION", reason="r", ticket="t",
                             exception_expires_at=trusted_now() + timedelta(days=1))
    assert refused.value.code == "WRONG_DIRECTION"
    compensation_resolve(case_pk=case.pk, user=lead, resolution="EXPLAINED", reason="r", ticket="t")
    resolved = snapshot(case)
    for call in (lambda: compensation_take(case_pk=case.pk, user=lead2),
                 lambda: compensation_resolve(case_pk=case.pk, user=lead, resolution="EXPLAINED", reason="r",
                                              ticket="t")):
        with pytest.raises(CompensationRefused) as refused:
            call()
        assert refused.value.code == "CASE_RESOLVED"
    assert snapshot(case) == resolved
    with pytest.raises(CompensationRefused) as refused:
        compensation_take(case_pk=999_999, user=lead)
    assert refused.value.code == "NO_SUCH_CASE"


def test_actions_are_append_only(grace_scene):

    case = open_case(grace_scene)
    with pytest.raises(AppendOnlyViolation):
        CompensationAction.objects.filter(case=case).update(outcome="rewritten")
    with pytest.raises(AppendOnlyViolation):
        CompensationCase.objects.filter(pk=case.pk).update(kind=K.ENTITLED_NOT_PAID)
