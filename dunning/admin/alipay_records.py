"""The Alipay adapter's merchant-side records, view-only: the agreements' terms, each renewal order
with the deductions sent for it (out_trade_no, what Alipay last said, the refusal's sub_code).
Support staff answer "was I charged twice?" here; nothing on these pages changes anything."""

from __future__ import annotations

from django.contrib import admin

from dunning.admin.base import ViewOnlyAdmin, ViewOnlyInline
from subscriptions.models import AlipayAgreement, AlipayRenewalOrder, AlipayTrade

TRADE_FIELDS = ("out_trade_no", "status", "sub_code", "trade_no", "amount", "sent_at", "answered_at", "paid_at",
                "idempotency_key")


class TradeInline(ViewOnlyInline):
    model = AlipayTrade
    fields = TRADE_FIELDS
    readonly_fields = TRADE_FIELDS
    ordering = ("sent_at", "pk")
    verbose_name = "deduction sent"
    verbose_name_plural = "deductions sent (alipay.trade.query is the truth; this is what we asked and heard)"


class OrderInline(ViewOnlyInline):
    model = AlipayRenewalOrder
    fields = ("order_no", "amount", "currency", "period_start", "period_end", "created_at")
    readonly_fields = fields
    ordering = ("-period_start",)


@admin.register(AlipayAgreement)
class AlipayAgreementAdmin(ViewOnlyAdmin):
    list_display = ("agreement_no", "external_agreement_no", "customer_email", "price_id", "amount", "currency",
                    "period_end", "merchant_canceled_at")
    search_fields = ("agreement_no", "external_agreement_no", "customer_email", "alipay_user_id")
    inlines = (OrderInline,)


@admin.register(AlipayRenewalOrder)
class AlipayRenewalOrderAdmin(ViewOnlyAdmin):
    list_display = ("order_no", "agreement", "amount", "currency", "period_start", "created_at")
    list_select_related = ("agreement",)
    search_fields = ("order_no", "agreement__agreement_no", "trades__out_trade_no")
    inlines = (TradeInline,)


@admin.register(AlipayTrade)
class AlipayTradeAdmin(ViewOnlyAdmin):
    list_display = ("out_trade_no", "order", "status", "sub_code", "amount", "sent_at", "paid_at")
    list_filter = ("status",)
    list_select_related = ("order",)
    search_fields = ("out_trade_no", "trade_no", "order__order_no")
