"""The Alipay adapter's merchant-side records, view-only: the agreements' terms, each renewal order
with the deductions sent for it (out_trade_no, what Alipay last said, the refusal's sub_code).
Support staff answer "was I charged twice?" here; nothing on these pages changes anything."""

from __future__ import annotations

from django.contrib import admin

from dunning.actions.notifications import money
from dunning.admin.base import ViewOnlyAdmin, ViewOnlyInline
from subscriptions.models import AlipayAgreement, AlipayRenewalOrder, AlipayTrade

# The inline's row title is the out_trade_no (with its link), so it is not a column again.
TRADE_FIELDS = ("status", "sub_code", "trade_no", "amount_shown", "sent_at", "answered_at", "paid_at",
                "idempotency_key")


class AmountShown:
    @admin.display(description="amount")
    def amount_shown(self, obj: AlipayAgreement | AlipayRenewalOrder | AlipayTrade) -> str:
        currency = obj.order.currency if isinstance(obj, AlipayTrade) else obj.currency
        return money(obj.amount, currency)


class TradeInline(AmountShown, ViewOnlyInline):
    model = AlipayTrade
    fields = TRADE_FIELDS
    readonly_fields = TRADE_FIELDS
    ordering = ("sent_at", "pk")
    verbose_name = "deduction sent"
    verbose_name_plural = "deductions sent (alipay.trade.query is the truth; this is what we asked and heard)"


class OrderInline(AmountShown, ViewOnlyInline):
    model = AlipayRenewalOrder
    fields = ("amount_shown", "period_start", "period_end", "created_at")
    readonly_fields = fields
    ordering = ("-period_start",)


@admin.register(AlipayAgreement)
class AlipayAgreementAdmin(AmountShown, ViewOnlyAdmin):
    list_display = ("agreement_no", "external_agreement_no", "customer_email", "price_id", "amount_shown",
                    "period_end", "merchant_canceled_at")
    fields = ("agreement_no", "external_agreement_no", "app_id", "customer_email", "alipay_user_id", "price_id",
              "amount_shown", "interval", "period_start", "period_end", "created_at", "merchant_canceled_at")
    readonly_fields = fields
    search_fields = ("agreement_no", "external_agreement_no", "customer_email", "alipay_user_id")
    inlines = (OrderInline,)


@admin.register(AlipayRenewalOrder)
class AlipayRenewalOrderAdmin(AmountShown, ViewOnlyAdmin):
    list_display = ("order_no", "agreement", "amount_shown", "period_start", "created_at")
    fields = ("order_no", "agreement", "amount_shown", "period_start", "period_end", "created_at")
    readonly_fields = fields
    list_select_related = ("agreement",)
    search_fields = ("order_no", "agreement__agreement_no", "trades__out_trade_no")
    inlines = (TradeInline,)


@admin.register(AlipayTrade)
class AlipayTradeAdmin(AmountShown, ViewOnlyAdmin):
    # The out_trade_no begins with its order's number, so the order is not a column of its own.
    list_display = ("out_trade_no", "status", "sub_code", "amount_shown", "sent_at", "paid_at")
    list_filter = ("status",)
    list_select_related = ("order",)
    search_fields = ("out_trade_no", "trade_no", "order__order_no")
