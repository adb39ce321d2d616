"""Seed 003's daily reconciliation against Alipay's trade bill (job alipay_bill)."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta

from dunning.jobs.alipay_jobs import bill_day, compare_bill
from dunning.jobs.framework import JobReport, job_run
from dunning.jobs.reconciliation import Findings
from dunning.models import Alert, ReconciliationReport
from subscriptions.models import AlipayAgreement, AlipayTrade
from subscriptions.providers.alipay.events import BEIJING
from subscriptions.providers.alipay.gateway import BillRow


def test_the_bill_agrees_with_a_paid_renewal_and_names_a_trade_we_never_sent(alipay, time_machine):
    sub = alipay.sign_up(balance_fen=10_000)
    time_machine.move_to(sub.current_period_end + timedelta(minutes=1), tick=True)
    job_run("alipay_renewals")
    (trade,) = AlipayTrade.objects.filter(order__agreement__agreement_no=sub.provider_subscription_id)
    assert trade.status == "TRADE_SUCCESS"
    next_day = datetime.now(UTC) + timedelta(days=1)
    time_machine.move_to(next_day, tick=True)
    job_run("alipay_bill")
    report = ReconciliationReport.objects.latest("pk")
    assert report.totals["bill_rows"] == 1 and report.totals["discrepancies"] == 0, report.discrepancies
    assert report.totals["bill_date"] == bill_day(datetime.now(UTC)).isoformat()

    # Somebody charged the customer outside this product (a deduction we never sent).
    time_machine.move_to(next_day + timedelta(minutes=5), tick=True)
    user_id = trade.order.agreement.alipay_user_id
    alipay.sim.set_balance(user_id, 10_000)
    answer = alipay.handle.gateway().trade_pay("STRAY0001", sub.provider_subscription_id, 500, "stray")
    assert answer.code == "10000"
    time_machine.move_to(next_day + timedelta(days=1), tick=True)
    job_run("alipay_bill")
    report = ReconciliationReport.objects.latest("pk")
    assert report.totals["by_kind"] == {"BILL_TRADE_UNKNOWN": 1}, report.discrepancies
    assert report.discrepancies[0]["out_trade_no"] == "STRAY0001"
    assert Alert.objects.filter(kind="RECONCILIATION_MISMATCH").count() == 1


def test_without_alipay_configured_the_jobs_say_so_and_do_nothing(db, settings):
    settings.ALIPAY_APP_ID = ""
    assert "not configured" in job_run("alipay_renewals").detail
    assert "not configured" in job_run("alipay_bill").detail


def test_a_deduction_paid_just_before_beijing_midnight_belongs_to_that_days_bill(alipay, time_machine):
    sub = alipay.sign_up(balance_fen=10_000)
    # 23:59:30 Beijing time on the renewal day (15:59:30 UTC): paid then, read back after midnight.
    renewal = sub.current_period_end.astimezone(BEIJING).replace(hour=23, minute=59, second=30)
    time_machine.move_to(renewal, tick=False)
    AlipayAgreement.objects.filter(agreement_no=sub.provider_subscription_id).update(period_end=renewal)
    job_run("alipay_renewals")
    (trade,) = AlipayTrade.objects.filter(order__agreement__agreement_no=sub.provider_subscription_id)
    assert trade.paid_at is not None and trade.paid_at.astimezone(BEIJING).date() == renewal.date()
    start = datetime.combine(renewal.date(), time.min, tzinfo=BEIJING)
    row = BillRow(trade.trade_no, trade.out_trade_no, "交易", "renewal", renewal, renewal, trade.amount,
                  "TRADE_SUCCESS")
    findings = Findings()
    compare_bill([row], start=start, end=start + timedelta(days=1), findings=findings, run=JobReport("t", renewal))
    assert len(findings) == 0, findings.listed
    # The next day's bill does not show it, and must not miss it either.
    findings = Findings()
    compare_bill([], start=start + timedelta(days=1), end=start + timedelta(days=2), findings=findings,
                 run=JobReport("t", renewal))
    assert len(findings) == 0, findings.listed
    # A day whose bill lacks it: named.
    findings = Findings()
    compare_bill([], start=start, end=start + timedelta(days=1), findings=findings, run=JobReport("t", renewal))
    assert findings.by_kind == {"LOCAL_PAID_NOT_IN_BILL": 1}
