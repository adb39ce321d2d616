"""Usage on the support console (issue 19 item 4): the subscription page's usage section (totals
per metric, invoiced and not yet; this period; the latest records) and a view-only list of every
usage record. Usage is shown beside the debt, never inside it: no cycle holds it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import admin
from django.urls import reverse

from dunning.admin.base import ViewOnlyAdmin
from dunning.clock import trusted_now
from subscriptions.billing.wording import money
from subscriptions.models import Subscription, UsageRecord
from subscriptions.usage_reads import MetricTotal, UsageTotals, current_period, usage_records_of, usage_totals

RECENT_RECORDS = 10


def _metric_row(total: MetricTotal, currency: str) -> dict[str, Any]:
    return {"metric": total.label, "records": total.records, "quantity": f"{total.quantity:,}",
            "cost": money(total.cost, currency),
            "uninvoiced": f"{total.uninvoiced_quantity:,} · {money(total.uninvoiced_cost, currency)}",
            "invoiced": f"{total.invoiced_quantity:,} · {money(total.invoiced_cost, currency)}"}


def _rows(totals: UsageTotals) -> list[dict[str, Any]]:
    return [_metric_row(m, totals.currency) for m in totals.metrics]


def usage_section(sub: Subscription) -> dict[str, Any]:
    """The context of templates/admin/subscriptions/subscription/usage_section.html."""
    now = trusted_now()
    all_time = usage_totals(sub)
    start, end = current_period(sub, now)
    period = usage_totals(sub, since=start, until=end)
    recent = list(usage_records_of(sub).select_related("producer").order_by("-occurred_at", "-pk")[:RECENT_RECORDS])
    currency = all_time.currency
    return {
        "usage_all_time": _rows(all_time),
        "usage_all_time_cost": money(all_time.cost, currency) if currency else "",
        "usage_uninvoiced_cost": money(all_time.uninvoiced_cost, currency) if currency else "",
        # The period ends before `end`: its last day is the one before.
        "usage_period": _rows(period), "usage_period_start": start, "usage_period_end": end - timedelta(microseconds=1),
        "usage_recent": [{"record": r, "quantity": f"{r.quantity:,}", "cost": money(r.cost, r.currency)}
                         for r in recent],
        "usage_record_count": all_time.records,
        "usage_list_url": reverse("admin:subscriptions_usagerecord_changelist") + f"?subscription__id__exact={sub.pk}",
        "usage_export_csv": reverse("api:subscription-usage-export-csv", args=[sub.pk]),
        "usage_export_json": reverse("api:subscription-usage-export-json", args=[sub.pk]),
    }


@admin.register(UsageRecord)
class UsageRecordAdmin(ViewOnlyAdmin):
    """Every usage record, read only: records are never edited or deleted (append-only)."""

    list_display = ("occurred_at", "subscription", "producer", "producer_record_id", "metric", "quantity", "cost",
                    "currency", "invoiced_at", "provider_invoice_id")
    list_filter = ("metric", ("invoiced_at", admin.EmptyFieldListFilter), "producer")
    list_select_related = ("subscription", "producer")
    search_fields = ("producer_record_id", "subscription__provider_subscription_id", "provider_invoice_id")
    search_help_text = "The producer's record id, a provider subscription id or invoice id."
    date_hierarchy = "occurred_at"
    show_full_result_count = False
    readonly_fields = ("subscription", "producer", "producer_record_id", "metric", "quantity", "cost", "currency",
                       "occurred_at", "received_at", "body_digest", "invoiced_at", "provider_invoice_id")
