"""AgentPay in the admin: the "Needs review" queue, every intent, tenants and wallets, the ledger,
the request log and the outbox.

Everything is read-only here (no add, change or delete: the state lines and the ledger change
only through the services). The queue's actions (take ownership, delivered → capture, not
delivered → release) and the wallet's staff credit are views in `agentpay.admin_review`, for
billing leads, each with a reason and a ticket.
"""

from __future__ import annotations

from django.contrib import admin
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html

from agentpay import admin_chain, admin_refunds  # noqa: F401  (register the on-chain pages and the refund queue)
from agentpay.admin_base import ReadOnlyAdmin
from agentpay.admin_review import (
    CREDIT_ACTION,
    LINK_CUSTOMER_ACTION,
    REVIEW_ACTIONS,
    intent_summary,
    intent_timeline,
    review_action_view,
    tenant_link_customer_view,
    wallet_credit_view,
)
from agentpay.composite import NEEDS_REVIEW_STATUSES, display_status_or_violation
from agentpay.models import (
    FulfillmentStatusQuery,
    GatewayRequest,
    IntentReceipt,
    LedgerAccount,
    OutboxMessage,
    PaymentIntent,
    PricedRoute,
    ReviewQueueIntent,
    Settlement,
    Tenant,
    Transfer,
    WebhookAttempt,
    WebhookDelivery,
)
from agentpay.states import Lines


def _age(since) -> str:  # noqa: ANN001
    if since is None:
        return "—"
    minutes = int((timezone.now() - since).total_seconds() // 60)
    return f"{minutes} min" if minutes < 120 else f"{minutes // 60} h {minutes % 60:02d} min"


@admin.register(PaymentIntent)
class PaymentIntentAdmin(ReadOnlyAdmin):
    list_display = ("intent_id", "tenant", "owner", "age", "rail", "amount_display", "status_badge", "state")
    list_filter = ("state", "rail")
    search_fields = ("intent_id", "idempotency_key", "tenant__name", "tenant__tenant_id")
    list_select_related = ("tenant", "review_owner", "fulfillment")
    list_per_page = 50
    show_full_result_count = False
    ordering = ("-created_at",)
    change_form_template = "admin/agentpay/paymentintent/change_form.html"
    fields = ("intent_id", "tenant", "route", "rail", "amount", "currency", "state", "generation", "idempotency_key",
              "first_request_id", "created_at", "state_changed_at", "needs_review_at", "review_owner",
              "review_owner_assigned_at")

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        latest = Settlement.objects.filter(intent=OuterRef("pk")).order_by("-pk").values("state")[:1]
        return super().get_queryset(request).annotate(settlement_state=Subquery(latest))

    @admin.display(description="owner", ordering="review_owner__username")
    def owner(self, intent: PaymentIntent) -> str:
        return intent.review_owner.get_username() if intent.review_owner_id else "—"

    @admin.display(description="age", ordering="created_at")
    def age(self, intent: PaymentIntent) -> str:
        return _age(intent.needs_review_at or intent.created_at)

    @admin.display(description="amount", ordering="amount")
    def amount_display(self, intent: PaymentIntent) -> str:
        return f"{intent.amount} {intent.currency.upper()}"

    @admin.display(description="display status")
    def status_badge(self, intent: PaymentIntent) -> str:
        status = display_status_or_violation(Lines(intent.rail, intent.state, intent.settlement_state,
                                                   intent.fulfillment.state))
        color = "#b00020" if status in NEEDS_REVIEW_STATUSES or intent.state == "needs_review" else "inherit"
        return format_html('<span class="ap-status" style="color:{};font-weight:600">{}</span>', color, status)

    def get_urls(self):  # noqa: ANN201
        opts = self.model._meta
        view = self.admin_site.admin_view(lambda request, object_id, key: review_action_view(self, request,
                                                                                           object_id, key))
        return [path("<int:object_id>/review/<slug:key>/", view, name=f"{opts.app_label}_{opts.model_name}_review"),
                *super().get_urls()]

    def change_view(self, request, object_id, form_url="", extra_context=None):  # noqa: ANN001, ANN201
        intent = (PaymentIntent.objects.select_related("tenant", "fulfillment", "review_owner")
                  .filter(pk=object_id).first() if str(object_id).isdigit() else None)
        extra = dict(extra_context or {})
        if intent is not None:
            opts = self.model._meta
            actions = []
            if intent.state == "needs_review":
                actions = [(REVIEW_ACTIONS[k], reverse(f"admin:{opts.app_label}_{opts.model_name}_review",
                                                       args=[intent.pk, k]))
                           for k in ("take_ownership", "delivered", "not_delivered")
                           if request.user.has_perm(REVIEW_ACTIONS[k].permission)]
            extra.update(intent_summary=intent_summary(intent), timeline=intent_timeline(intent),
                         review_actions=actions, in_review=intent.state == "needs_review")
        return super().change_view(request, object_id, form_url, extra)


@admin.register(ReviewQueueIntent)
class ReviewQueueAdmin(PaymentIntentAdmin):
    """The queue: oldest first, owner and age in view."""

    list_filter = ("rail",)
    ordering = ("needs_review_at",)

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).filter(state="needs_review")


@admin.register(Tenant)
class TenantAdmin(ReadOnlyAdmin):
    list_display = ("tenant_id", "name", "status", "subscription_ref", "provider_customer_ref", "created_at")
    search_fields = ("tenant_id", "name", "provider_customer_ref")
    change_form_template = "admin/agentpay/tenant/change_form.html"

    def get_urls(self):  # noqa: ANN201
        view = self.admin_site.admin_view(lambda request, object_id: tenant_link_customer_view(self, request,
                                                                                               object_id))
        return [path("<int:object_id>/link-customer/", view, name="agentpay_tenant_link_customer"),
                *super().get_urls()]

    def change_view(self, request, object_id, form_url="", extra_context=None):  # noqa: ANN001, ANN201
        tenant = Tenant.objects.filter(pk=object_id).first() if str(object_id).isdigit() else None
        extra = dict(extra_context or {})
        if tenant is not None:
            extra["customer_links"] = tenant.customer_links.select_related("actor_user").order_by("-pk")[:50]
            if request.user.has_perm(LINK_CUSTOMER_ACTION.permission):
                extra.update(link_action=LINK_CUSTOMER_ACTION,
                             link_url=reverse("admin:agentpay_tenant_link_customer", args=[tenant.pk]))
        return super().change_view(request, object_id, form_url, extra)


@admin.register(LedgerAccount)
class LedgerAccountAdmin(ReadOnlyAdmin):
    list_display = ("account_id", "kind", "tenant", "currency", "available_display", "debits_pending",
                    "credits_posted", "debits_posted", "frozen")
    list_filter = ("kind", "currency", "frozen")
    list_select_related = ("tenant",)
    search_fields = ("account_id", "tenant__name", "tenant__tenant_id")
    change_form_template = "admin/agentpay/ledgeraccount/change_form.html"

    @admin.display(description="available")
    def available_display(self, account: LedgerAccount) -> int | str:
        return account.available if account.kind == "wallet" else "—"

    def get_urls(self):  # noqa: ANN201
        view = self.admin_site.admin_view(lambda request, object_id: wallet_credit_view(self, request, object_id))
        return [path("<int:object_id>/credit/", view, name="agentpay_ledgeraccount_credit"), *super().get_urls()]

    def change_view(self, request, object_id, form_url="", extra_context=None):  # noqa: ANN001, ANN201
        account = LedgerAccount.objects.filter(pk=object_id).first() if str(object_id).isdigit() else None
        extra = dict(extra_context or {})
        if account is not None and account.kind == "wallet" and request.user.has_perm(CREDIT_ACTION.permission):
            extra.update(credit_action=CREDIT_ACTION,
                         credit_url=reverse("admin:agentpay_ledgeraccount_credit", args=[account.pk]))
        return super().change_view(request, object_id, form_url, extra)


@admin.register(Transfer)
class TransferAdmin(ReadOnlyAdmin):
    list_display = ("transfer_id", "kind", "amount", "currency", "debit_account", "credit_account", "intent", "actor",
                    "ticket", "created_at")
    list_filter = ("kind", "currency")
    list_select_related = ("debit_account", "credit_account", "intent", "debit_account__tenant",
                           "credit_account__tenant")
    search_fields = ("transfer_id", "intent__intent_id", "ticket", "external_ref")
    show_full_result_count = False


@admin.register(IntentReceipt)
class IntentReceiptAdmin(ReadOnlyAdmin):
    list_display = ("intent", "line", "event", "accepted", "from_state", "to_state", "refusal_code", "actor",
                    "trusted_time")
    list_filter = ("accepted", "line")
    list_select_related = ("intent",)
    search_fields = ("intent__intent_id", "event", "refusal_code", "ticket")
    show_full_result_count = False


@admin.register(GatewayRequest)
class GatewayRequestAdmin(ReadOnlyAdmin):
    list_display = ("request_id", "method", "path", "answer_status", "answer_problem", "tenant", "intent",
                    "received_at", "duration_ms")
    list_filter = ("answer_status",)
    list_select_related = ("tenant", "intent")
    search_fields = ("=request_id", "intent__intent_id", "idempotency_key")
    exclude = ("body",)
    show_full_result_count = False


@admin.register(OutboxMessage)
class OutboxMessageAdmin(ReadOnlyAdmin):
    list_display = ("dedupe_key", "topic", "created_at", "published_at", "delivery_attempts", "last_error")
    list_filter = ("topic",)
    search_fields = ("dedupe_key", "intent__intent_id")
    show_full_result_count = False


@admin.register(FulfillmentStatusQuery)
class FulfillmentStatusQueryAdmin(ReadOnlyAdmin):
    list_display = ("fulfillment", "asked_at", "answer", "fenced", "http_status", "latency_ms", "proves", "error")
    list_filter = ("answer", "timed_out")
    list_select_related = ("fulfillment",)
    search_fields = ("fulfillment__fulfillment_id", "fulfillment__intent__intent_id", "=request_id")
    show_full_result_count = False


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdmin):
    list_display = ("dedupe_key", "tenant", "url", "delivered_at", "attempts", "last_status", "last_error")
    list_filter = ("last_status",)
    list_select_related = ("tenant",)
    search_fields = ("dedupe_key", "tenant__tenant_id", "tenant__name")
    show_full_result_count = False


@admin.register(WebhookAttempt)
class WebhookAttemptAdmin(ReadOnlyAdmin):
    list_display = ("delivery", "attempted_at", "http_status", "latency_ms", "error")
    list_select_related = ("delivery",)
    search_fields = ("delivery__dedupe_key",)
    show_full_result_count = False


@admin.register(PricedRoute)
class PricedRouteAdmin(ReadOnlyAdmin):
    list_display = ("slug", "name", "method", "price_minor", "currency", "rails_allowed", "fences_not_found",
                    "active")
