"""Seed 003's duties as scheduled jobs: `compensation_intake` (every 5 minutes) and
`sample_review` (daily; one sample per ISO week).

Why a job scans the detectors' output instead of the detectors opening cases themselves: the
alerts and reconciliation jobs stay exactly as they are (their transactions, their tests, their
failure modes), and what they store — PAID_NOT_RESTORED alerts and ReconciliationReport findings —
is append-only, so reading it a few minutes later loses nothing. Each source (an alert; a report's
finding for one subscription and kind) is read into the queue once — it opens a case, or counts
a sighting on the unresolved one — and a CompensationAction names it, so a source already read is
skipped: resolving a case never makes an older alert or last week's report reopen it.

Mapping to the two kinds of seed 003:
- PAID_NOT_ENTITLED ("已支付未开通"): an open PAID_NOT_RESTORED alert; the findings
  PROVIDER_PAID_NO_LOCAL_FACT and PAID_BUT_CYCLE_OPEN; ENTITLEMENT_MISMATCH where the recomputed
  profile is more permissive than the one held.
- ENTITLED_NOT_PAID ("已开通未支付"): the finding LOCAL_PAID_PROVIDER_NOT_PAID; ENTITLEMENT_MISMATCH
  where the recomputed profile is more restrictive than the one held.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from dunning.actions.compensation import compensation_open
from dunning.actions.sample_review import sample_review_pick
from dunning.jobs.framework import JobReport, ahead_of_the_clock, job_setting, one_worker_at_a_time, scheduled_job
from dunning.models import Alert, AlertKind, ReconciliationReport
from dunning.models.duties import CompensationAction, CompensationCase, CompensationKind
from entitlements.profiles import get_profile
from subscriptions.models import Invoice, Subscription

INTAKE = "compensation_intake"
SAMPLE = "sample_review"
K = CompensationKind
FINDING_KINDS = {
    "PROVIDER_PAID_NO_LOCAL_FACT": K.PAID_NOT_ENTITLED,
    "PAID_BUT_CYCLE_OPEN": K.PAID_NOT_ENTITLED,
    "LOCAL_PAID_PROVIDER_NOT_PAID": K.ENTITLED_NOT_PAID,
}


def finding_kind(finding: dict[str, Any]) -> str | None:
    """The compensation kind a reconciliation finding calls for, or None."""
    if finding.get("kind") in FINDING_KINDS:
        return FINDING_KINDS[finding["kind"]]
    if finding.get("kind") == "ENTITLEMENT_MISMATCH":
        try:
            held = get_profile(finding["stored_profile"]).rank
            due = get_profile(finding["recomputed_profile"]).rank
        except (KeyError, ValueError):
            return None
        if due < held:
            return K.PAID_NOT_ENTITLED
        if due > held:
            return K.ENTITLED_NOT_PAID
    return None


@scheduled_job(INTAKE, "Compensation queue: open a case for each paid-not-entitled / entitled-not-paid mismatch "
                       "found by the alerts or reconciliation jobs")
@one_worker_at_a_time(INTAKE, "the compensation intake")
def compensation_intake(run: JobReport) -> None:
    if ahead_of_the_clock(run):
        return
    _from_alerts(run)
    _from_reports(run)


def _count(run: JobReport, opened: bool, case: CompensationCase) -> None:
    if opened:
        run.changed += 1
        run.note(f"opened case {case.pk}: {case.kind} {case.subscription.provider_subscription_id}")


def _from_alerts(run: JobReport) -> None:
    cited = CompensationAction.objects.filter(source_alert__isnull=False).values("source_alert_id")
    alerts = (Alert.objects.filter(kind=AlertKind.PAID_NOT_RESTORED, resolved_at__isnull=True,
                                   subscription__isnull=False, raised_at__lte=run.now)
              .exclude(pk__in=cited).select_related("subscription", "invoice").order_by("pk"))
    for alert in alerts:
        run.examined += 1
        case, opened = compensation_open(kind=K.PAID_NOT_ENTITLED, subscription=alert.subscription,
                                         invoice=alert.invoice, alert=alert, finding=alert.figures,
                                         detail=alert.detail, now=run.now)
        _count(run, opened, case)


def _from_reports(run: JobReport) -> None:
    lookback = timedelta(days=float(job_setting("DUNNING_COMPENSATION_REPORT_LOOKBACK_DAYS", 3)))
    reports = ReconciliationReport.objects.filter(created_at__gt=run.now - lookback, created_at__lte=run.now)
    for report in reports.order_by("pk"):
        already = set(CompensationAction.objects.filter(source_report=report)
                      .values_list("case__subscription_id", "case__kind"))
        wanted: dict[tuple[int, str], dict[str, Any]] = {}
        for finding in report.discrepancies:
            kind = finding_kind(finding)
            if kind is None or not isinstance(finding.get("subscription"), int):
                continue
            wanted.setdefault((finding["subscription"], kind), finding)
        subs = Subscription.objects.in_bulk([pk for pk, _ in wanted])
        invoices = Invoice.objects.in_bulk([f["invoice"] for f in wanted.values() if isinstance(f.get("invoice"), int)])
        for (sub_pk, kind), finding in wanted.items():
            run.examined += 1
            if (sub_pk, kind) in already or sub_pk not in subs:
                continue
            case, opened = compensation_open(
                kind=kind, subscription=subs[sub_pk], invoice=invoices.get(finding.get("invoice")), report=report,
                finding=finding, now=run.now,
                detail=f"Reconciliation report {report.pk}: {finding.get('kind')}: {finding.get('detail', '')}")
            _count(run, opened, case)


@scheduled_job(SAMPLE, "Weekly sample review: pick at least 20 subscriptions with a failed payment last ISO week")
@one_worker_at_a_time(SAMPLE, "the sample review pick")
def sample_review(run: JobReport) -> None:
    if ahead_of_the_clock(run):
        return
    review, picked = sample_review_pick(now=run.now)
    run.examined += review.population if picked else 0
    if picked:
        run.changed += 1
        run.note(f"picked {review.items.count()} of {review.population} failed subscriptions for {review.week}")
    else:
        run.note(f"{review.week} was already picked at {review.picked_at.isoformat()}")
