"""Reading usage records: totals per metric (invoiced and not yet), the current billing period,
and the rows of an export. Read only; `subscriptions.usage` is the one writer."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

import isodate
from django.db.models import Count, Q, QuerySet, Sum

from subscriptions.models import BillingInterval, Subscription, UsageMetric, UsageRecord

EXPORT_COLUMNS = ("id", "producer", "producer_record_id", "metric", "quantity", "cost", "currency", "occurred_at",
                  "received_at", "invoiced_at", "provider_invoice_id", "body_digest")
_INTERVALS = {BillingInterval.MONTH: isodate.parse_duration("P1M"), BillingInterval.YEAR: isodate.parse_duration("P1Y")}


@dataclass(frozen=True)
class MetricTotal:
    metric: str
    label: str
    records: int
    quantity: int
    cost: int
    uninvoiced_quantity: int
    uninvoiced_cost: int

    @property
    def invoiced_quantity(self) -> int:
        return self.quantity - self.uninvoiced_quantity

    @property
    def invoiced_cost(self) -> int:
        return self.cost - self.uninvoiced_cost


@dataclass(frozen=True)
class UsageTotals:
    currency: str
    metrics: list[MetricTotal] = field(default_factory=list)

    @property
    def cost(self) -> int:
        return sum(m.cost for m in self.metrics)

    @property
    def uninvoiced_cost(self) -> int:
        return sum(m.uninvoiced_cost for m in self.metrics)

    @property
    def records(self) -> int:
        return sum(m.records for m in self.metrics)


def usage_records_of(subscription: Subscription) -> QuerySet:
    return UsageRecord.objects.filter(subscription=subscription)


def usage_totals(subscription: Subscription, *, since: datetime | None = None,
                 until: datetime | None = None) -> UsageTotals:
    """Totals per metric over [since, until) of occurred_at (all time when not given), in one query."""
    records = usage_records_of(subscription)
    if since is not None:
        records = records.filter(occurred_at__gte=since)
    if until is not None:
        records = records.filter(occurred_at__lt=until)
    uninvoiced = Q(invoiced_at__isnull=True)
    rows = {row["metric"]: row for row in records.order_by().values("metric").annotate(
        n=Count("pk"), total_quantity=Sum("quantity"), total_cost=Sum("cost"),
        open_quantity=Sum("quantity", filter=uninvoiced, default=0),
        open_cost=Sum("cost", filter=uninvoiced, default=0))}
    labels = dict(UsageMetric.choices)
    metrics = [MetricTotal(metric, labels.get(metric, metric), row["n"], row["total_quantity"], row["total_cost"],
                           row["open_quantity"], row["open_cost"])
               for metric, row in sorted(rows.items())]
    currency = records.values_list("currency", flat=True).first() or ""
    return UsageTotals(currency=currency, metrics=metrics)


def current_period(subscription: Subscription, now: datetime) -> tuple[datetime, datetime]:
    """The billing period `now` falls in: one interval back from the provider's current_period_end;
    the calendar month when the provider has not told us a period end."""
    end = subscription.current_period_end
    interval = _INTERVALS.get(subscription.billing_interval, _INTERVALS[BillingInterval.MONTH])
    if end is None:
        start = now.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        return start, start + _INTERVALS[BillingInterval.MONTH]
    while end <= now:  # the mirror lags a renewal: step forward to the period that holds now
        end = end + interval
    return end - interval, end


def export_rows(subscription: Subscription) -> Iterator[dict[str, object]]:
    """Every record of the subscription, oldest first, as plain values (CSV and JSON alike)."""
    records = usage_records_of(subscription).select_related("producer").order_by("occurred_at", "pk")
    for r in records.iterator(chunk_size=500):
        yield {"id": r.pk, "producer": r.producer.name, "producer_record_id": r.producer_record_id,
               "metric": r.metric, "quantity": r.quantity, "cost": r.cost, "currency": r.currency,
               "occurred_at": r.occurred_at.isoformat(), "received_at": r.received_at.isoformat(),
               "invoiced_at": r.invoiced_at.isoformat() if r.invoiced_at else None,
               "provider_invoice_id": r.provider_invoice_id, "body_digest": r.body_digest}


class _Echo:
    """csv.writer writes into this and gets the line back, so an export streams as rows are read."""

    def write(self, value: str) -> str:
        return value


def export_csv_lines(subscription: Subscription) -> Iterator[str]:
    """The export as CSV lines (header first), one record a line; empty cells for what is not set."""
    writer = csv.DictWriter(_Echo(), fieldnames=EXPORT_COLUMNS)
    yield writer.writeheader()
    for row in export_rows(subscription):
        yield writer.writerow({k: "" if v is None else v for k, v in row.items()})
