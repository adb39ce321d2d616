"""Alert deliveries (issue 19 item 2), view-only: find the FAILED ones across all alerts. Each
alert's own page lists its deliveries and tries (templates/admin/dunning/alert/change_form.html)."""

from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from dunning.admin.base import ViewOnlyAdmin
from dunning.models import AlertDelivery


@admin.register(AlertDelivery)
class AlertDeliveryAdmin(ViewOnlyAdmin):
    list_display = ("case", "channel", "status", "attempts", "last_status_code", "last_error", "created_at", "sent_at")
    list_filter = ("status", "channel")
    search_fields = ("alert__dedupe_key", "target")
    list_select_related = ("alert",)
    ordering = ("-created_at", "-pk")
    readonly_fields = [f.name for f in AlertDelivery._meta.fields]

    @admin.display(description="alert", ordering="alert__raised_at")
    def case(self, delivery: AlertDelivery) -> str:
        url = reverse("admin:dunning_alert_change", args=[delivery.alert_id])
        return format_html('<a href="{}">{}</a>', url, delivery.alert.dedupe_key)
