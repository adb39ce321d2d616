"""Alipay's two scheduled duties (seed 003).

* `alipay_renewals`: open each due period's renewal order, send its first deduction once, and
  read the order back as evidence (the cycle opens, then records a failure or settles paid);
  deductions left without an answer are asked about again, never blindly resent.
* `alipay_bill`: the daily reconciliation against Alipay's trade bill: every successful trade in
  the bill must be money we recorded, every payment we recorded must be in the bill, and no order
  may be paid twice.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import date, datetime, time, timedelta

from dunning.acceptance.inputs import Cause
from dunning.actions.alerts import alert_raise
from dunning.evidence.processing import invoice_refresh
from dunning.jobs.framework import JobReport, one_worker_at_a_time, scheduled_job
from dunning.jobs.reconciliation import Findings, Kind
from dunning.models import AlertKind, FactKind, MonetaryFact, ReconciliationReport
from subscriptions.providers.alipay import billing
from subscriptions.providers.alipay.adapter import AlipayProvider
from subscriptions.providers.alipay.events import BEIJING
from subscriptions.providers.alipay.records import PAID_TRADE_STATUSES, AlipayTrade
from subscriptions.providers.base import ProviderError, ProviderNotFound
from subscriptions.providers.registry import get_provider

RENEWALS = "alipay_renewals"
BILL = "alipay_bill"


class BillKind:
    BILL_TRADE_UNKNOWN = "BILL_TRADE_UNKNOWN"  # Alipay charged a deduction we never sent
    PROVIDER_PAID_NO_LOCAL_FACT = Kind.PROVIDER_PAID_NO_LOCAL_FACT  # in the bill, no payment fact of ours
    AMOUNT_MISMATCH = Kind.AMOUNT_MISMATCH
    LOCAL_PAID_NOT_IN_BILL = "LOCAL_PAID_NOT_IN_BILL"  # we recorded money the bill does not show
    ORDER_PAID_TWICE = "ORDER_PAID_TWICE"  # seed 003: one order, several successful deductions
    BILL_REFUND = "BILL_REFUND"  # money returned outside this product


def _alipay() -> AlipayProvider | None:
    provider = get_provider("alipay")
    return provider if isinstance(provider, AlipayProvider) and provider.account else None


@scheduled_job(RENEWALS, "Alipay renewals: open due renewal orders, send each first deduction once, read back")
@one_worker_at_a_time(RENEWALS, "the Alipay renewals")
def alipay_renewals(run: JobReport) -> None:
    provider = _alipay()
    if provider is None:
        run.note("Alipay is not configured (ALIPAY_APP_ID unset): nothing to renew")
        return
    cause = Cause.job(run.job)
    for order in billing.open_due_orders(now=run.now):
        run.examined += 1
        _read_back(run, order.order_no, cause)  # the cycle opens before anything is charged
        run.note(f"{order.order_no}: {billing.renewal_charge(provider, order)}")
        _read_back(run, order.order_no, cause)
        run.changed += 1
        run.tick()
    for order in billing.unanswered_renewals():
        run.examined += 1
        run.note(f"{order.order_no} asked again: {billing.renewal_charge(provider, order)}")
        _read_back(run, order.order_no, cause)
        run.tick()


def _read_back(run: JobReport, order_no: str, cause: Cause) -> None:
    try:
        result = invoice_refresh(provider_name="alipay", invoice_id=order_no, cause=cause, now=run.now)
    except ProviderError as exc:
        run.errors += 1
        run.note(f"{order_no}: Alipay did not answer ({exc}); asked again next run")
        return
    if result.detail:
        run.note(f"{order_no}: {result.outcome} {'; '.join(result.detail)[:300]}")


def bill_day(now: datetime) -> date:
    """The last whole day of Alipay's bills (they are cut at midnight, Beijing time)."""
    return now.astimezone(BEIJING).date() - timedelta(days=1)


@scheduled_job(BILL, "Alipay daily bill: successful trades in Alipay's bill vs the payments we recorded")
@one_worker_at_a_time(BILL, "the Alipay bill reconciliation")
def alipay_bill(run: JobReport) -> None:
    provider = _alipay()
    if provider is None:
        run.note("Alipay is not configured (ALIPAY_APP_ID unset): no bill to compare")
        return
    day = bill_day(run.now)
    start = datetime.combine(day, time.min, tzinfo=BEIJING)
    end = start + timedelta(days=1)
    findings = Findings()
    try:
        rows = provider.gateway.bill_rows(day)
    except ProviderNotFound:
        rows = []  # no trade that day: the bill is empty, our payments of that day must be too
    except ProviderError as exc:
        run.errors += 1
        run.note(f"bill for {day} not fetched: {exc}; the next run tries again")
        return
    compare_bill(rows, start=start, end=end, findings=findings, run=run)
    totals = {"bill_date": day.isoformat(), "bill_rows": len(rows), "discrepancies": len(findings),
              "by_kind": dict(sorted(findings.by_kind.items())), "provider": "alipay"}
    report = ReconciliationReport.objects.create(run_for=run.now, window_start=start, window_end=end,
                                                 created_at=run.now, totals=totals, discrepancies=findings.listed)
    run.note(f"Alipay bill {day}: {len(rows)} trades, {len(findings)} discrepancies (report {report.pk})")
    if findings:
        summary = ", ".join(f"{n} × {k}" for k, n in totals["by_kind"].items())
        alert_raise(kind=AlertKind.RECONCILIATION_MISMATCH, dedupe_key=f"alipay-bill:{day.isoformat()}",
                    detail=f"Alipay's bill of {day} disagrees with our records: {summary}. "
                           f"See reconciliation report {report.pk}.",
                    figures={"report": report.pk, "bill_date": day.isoformat(), "by_kind": totals["by_kind"]},
                    now=run.now)


def compare_bill(rows: list, *, start: datetime, end: datetime, findings: Findings, run: JobReport) -> None:
    """Seed 003's daily check: Alipay's successful trades, our trades, and our payment facts."""
    for row in rows:
        if row.status != "TRADE_SUCCESS":
            # Refunds are made outside this product (it sends none): a person should look.
            findings.add(BillKind.BILL_REFUND, f"Alipay's bill shows a {row.business_type} of {row.amount_fen} fen "
                         f"for {row.out_trade_no}; this product records no Alipay refunds",
                         out_trade_no=row.out_trade_no, trade_no=row.trade_no)
    in_bill = {row.out_trade_no: row for row in rows if row.status == "TRADE_SUCCESS"}
    trades = {t.out_trade_no: t for t in AlipayTrade.objects.select_related("order").filter(
        out_trade_no__in=list(in_bill))}
    facts = {f.provider_ref: f for f in MonetaryFact.objects.filter(
        kind=FactKind.PAYMENT_SUCCEEDED, invoice__provider="alipay", provider_ref__in=list(in_bill))}
    paid_per_order: dict[str, list[str]] = defaultdict(list)
    for out_trade_no, row in in_bill.items():
        run.examined += 1
        trade = trades.get(out_trade_no)
        if trade is None:
            findings.add(BillKind.BILL_TRADE_UNKNOWN, f"Alipay's bill shows {row.amount_fen} fen for "
                         f"{out_trade_no}, a deduction we never sent", out_trade_no=out_trade_no,
                         trade_no=row.trade_no)
            continue
        paid_per_order[trade.order.order_no].append(out_trade_no)
        if row.amount_fen != trade.amount:
            findings.add(BillKind.AMOUNT_MISMATCH, f"bill shows {row.amount_fen} fen for {out_trade_no}; we sent "
                         f"{trade.amount}", out_trade_no=out_trade_no, invoice=trade.order.order_no)
        if out_trade_no not in facts:
            findings.add(BillKind.PROVIDER_PAID_NO_LOCAL_FACT, f"Alipay collected {out_trade_no} for order "
                         f"{trade.order.order_no}; we recorded no payment", out_trade_no=out_trade_no,
                         invoice=trade.order.order_no)
    for order_no, paid in paid_per_order.items():
        others = AlipayTrade.objects.filter(order__order_no=order_no, status__in=list(PAID_TRADE_STATUSES)) \
            .exclude(out_trade_no__in=paid).values_list("out_trade_no", flat=True)
        if len(paid) + len(others) > 1:
            findings.add(BillKind.ORDER_PAID_TWICE, f"order {order_no} was paid by {len(paid) + len(others)} "
                         f"deductions: {', '.join(sorted([*paid, *others]))}", invoice=order_no)
    # Our side of the day: deductions Alipay told us were paid that day (its own payment time, so
    # a payment just before midnight is in that day's bill whenever we recorded it).
    ours = AlipayTrade.objects.select_related("order").filter(status__in=list(PAID_TRADE_STATUSES),
                                                              paid_at__gte=start, paid_at__lt=end)
    for trade in ours:
        if trade.out_trade_no not in in_bill:
            findings.add(BillKind.LOCAL_PAID_NOT_IN_BILL, f"Alipay told us {trade.out_trade_no} ({trade.amount} "
                         f"fen, order {trade.order.order_no}) was paid that day; its bill does not show it",
                         invoice=trade.order.order_no, out_trade_no=trade.out_trade_no)
