"""Admin pages for operations: job runs, alerts, reconciliation reports, incidents and
notification deliveries. All read-only here; incidents are started and ended through
`dunning.services.incidents` (and the support console's actions)."""

from __future__ import annotations

import json

from django.contrib import admin
from django.utils.html import format_html

from dunning.admin_base import ViewOnlyAdmin
from dunning.models import Alert, IncidentSwitch, JobRun, NotificationDelivery, ReconciliationReport


@admin.register(JobRun)
class JobRunAdmin(ViewOnlyAdmin):
    list_display = ("job", "run_for", "status", "examined", "changed", "refused", "errors", "duration", "worker")
    list_filter = ("job", "status")
    date_hierarchy = "run_for"
    readonly_fields = [f.name for f in JobRun._meta.fields]

    @admin.display(description="took")
    def duration(self, run: JobRun) -> str:
        if run.finished_at is None:
            return "running"
        return f"{(run.finished_at - run.started_at).total_seconds():.2f} s"


@admin.register(Alert)
class AlertAdmin(ViewOnlyAdmin):
    list_display = ("kind", "detail", "occurrences", "raised_at", "last_seen_at", "resolved_at")
    list_filter = ("kind", ("resolved_at", admin.EmptyFieldListFilter))
    search_fields = ("dedupe_key", "detail", "invoice__provider_invoice_id",
                     "subscription__provider_subscription_id")
    list_select_related = ("subscription", "invoice")
    readonly_fields = [f.name for f in Alert._meta.fields]


@admin.register(ReconciliationReport)
class ReconciliationReportAdmin(ViewOnlyAdmin):
    list_display = ("window_start", "window_end", "created_at", "discrepancy_count")
    readonly_fields = ("run_for", "window_start", "window_end", "created_at", "totals_table", "discrepancy_list")
    exclude = ("totals", "discrepancies")

    @admin.display(description="discrepancies")
    def discrepancy_count(self, report: ReconciliationReport) -> int:
        return len(report.discrepancies)

    @admin.display(description="totals")
    def totals_table(self, report: ReconciliationReport) -> str:
        return format_html("<pre>{}</pre>", json.dumps(report.totals, indent=2, sort_keys=True, default=str))

    @admin.display(description="discrepancies")
    def discrepancy_list(self, report: ReconciliationReport) -> str:
        return format_html("<pre>{}</pre>", json.dumps(report.discrepancies, indent=2, default=str))


@admin.register(IncidentSwitch)
class IncidentSwitchAdmin(ViewOnlyAdmin):
    list_display = ("ticket", "cohort", "pause_restrictions", "started_at", "started_by", "ended_at", "ended_by")
    list_filter = (("ended_at", admin.EmptyFieldListFilter),)
    readonly_fields = [f.name for f in IncidentSwitch._meta.fields]


@admin.register(NotificationDelivery)
class NotificationDeliveryAdmin(ViewOnlyAdmin):
    list_display = ("template", "recipient", "status", "reason", "handled_at")
    list_filter = ("template", "status")
    search_fields = ("recipient",)
    readonly_fields = [f.name for f in NotificationDelivery._meta.fields]
