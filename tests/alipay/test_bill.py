"""Seed 003's daily reconciliation against Alipay's trade bill (job alipay_bill)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dunning.jobs.alipay_jobs import bill_day
from dunning.jobs.framework import job_run
from dunning.models import Alert, ReconciliationReport
from subscriptions.models import AlipayTrade


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
