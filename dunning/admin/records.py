from django.contrib import admin
from simple_history.admin import SimpleHistoryAdmin

from dunning.admin.base import ViewOnlyAdmin, ViewOnlyInline
from dunning.admin.filters import CycleAgeFilter, HeldEventFilter, InvoiceProviderFilter, OwnerFilter, ProviderFilter
from dunning.admin.operations import EventReprocessMixin
from dunning.admin.paging import EstimatedCountPaginator
from dunning.admin.stored_bodies import StoredBodyMixin
from dunning.models import (
    DunningCycle,
    DunningPolicy,
    MonetaryFact,
    OutboxMessage,
    PaymentAttempt,
    ProviderEvent,
    ProviderReceipt,
    TransitionReceipt,
    WebhookDelivery,
)
from subscriptions.providers.labels import provider_label, provider_with_account


class AttemptInline(ViewOnlyInline):
    model = PaymentAttempt
    fk_name = "cycle"
    fields = ("operation_id", "origin", "state", "idempotency_key", "decline_code", "created_at", "resolved_at")
    readonly_fields = fields


class FactInline(ViewOnlyInline):
    model = MonetaryFact
    fields = ("kind", "amount", "currency", "provider_ref", "occurred_at", "receipt")
    readonly_fields = fields


class ReceiptInline(ViewOnlyInline):
    model = TransitionReceipt
    fk_name = "cycle"
    fields = ("trusted_time", "edge", "from_state", "to_state", "accepted", "rejection_reason", "actor",
              "decision_profile", "entitlement_generation")
    readonly_fields = fields
    ordering = ("-id",)


@admin.register(DunningCycle)
class DunningCycleAdmin(ViewOnlyAdmin, SimpleHistoryAdmin):
    list_display = ("cycle_id", "subscription", "provider_shown", "invoice", "state", "generation", "failure_class",
                    "grace_expires_at", "next_attempt_at", "unknown_owner")
    list_filter = ("state", InvoiceProviderFilter, "policy", OwnerFilter, CycleAgeFilter, "failure_class",
                   "customer_action_required")
    list_select_related = ("subscription", "invoice", "unknown_owner")
    search_fields = ("cycle_id", "invoice__provider_invoice_id", "subscription__provider_subscription_id",
                     "subscription__customer__email", "subscription__customer__provider_customer_id")
    inlines = [AttemptInline, FactInline, ReceiptInline]
    show_full_result_count = False

    @admin.display(description="provider", ordering="invoice__provider")
    def provider_shown(self, cycle: DunningCycle) -> str:
        return provider_with_account(cycle.invoice.provider, cycle.subscription.provider_account)


@admin.register(DunningPolicy)
class DunningPolicyAdmin(ViewOnlyAdmin):
    list_display = ("identity", "mode", "retry_authority", "is_default", "cohort", "published_at")
    readonly_fields = ("identity", "name", "version", "mode", "retry_authority", "prices", "cohort", "is_default",
                       "digest", "published_at", "published_by", "source_text", "document")
    exclude = ()


@admin.register(ProviderEvent)
class ProviderEventAdmin(EventReprocessMixin, StoredBodyMixin, ViewOnlyAdmin):
    """The inbox: why each event was held, and (billing leads) fetch a held one again."""

    list_display = ("event_label", "provider_shown", "outcome_badge", "why", "received")
    list_filter = (HeldEventFilter, ProviderFilter, "outcome", "event_type")
    list_select_related = ("subscription",)
    search_fields = ("event_id",)
    search_help_text = "The provider's event id (evt_…, or Alipay's notify_id)."
    show_full_result_count = False
    paginator = EstimatedCountPaginator

    @admin.display(description="provider", ordering="provider")
    def provider_shown(self, event: ProviderEvent) -> str:
        return provider_label(event.provider)


@admin.register(ProviderReceipt)
class ProviderReceiptAdmin(StoredBodyMixin, ViewOnlyAdmin):
    list_display = ("object_type", "object_id", "status", "amount", "currency", "fetched_at")
    list_filter = ("object_type", "status")
    search_fields = ("object_id",)
    show_full_result_count = False
    paginator = EstimatedCountPaginator


@admin.register(MonetaryFact)
class MonetaryFactAdmin(ViewOnlyAdmin):
    list_display = ("kind", "invoice", "amount", "currency", "occurred_at", "recorded_at")
    list_filter = ("kind",)
    list_select_related = ("invoice",)
    show_full_result_count = False
    paginator = EstimatedCountPaginator


@admin.register(TransitionReceipt)
class TransitionReceiptAdmin(ViewOnlyAdmin):
    list_display = ("trusted_time", "subscription", "edge", "from_state", "to_state", "accepted",
                    "rejection_reason", "actor", "decision_profile", "entitlement_generation")
    list_filter = ("accepted", "edge", "rejection_reason", "cause_kind")
    list_select_related = ("subscription",)
    search_fields = ("subscription__provider_subscription_id", "cause_ref", "ticket")
    show_full_result_count = False
    paginator = EstimatedCountPaginator


@admin.register(OutboxMessage)
class OutboxMessageAdmin(ViewOnlyAdmin):
    list_display = ("topic", "dedupe_key", "created_at", "published_at", "delivery_attempts")
    list_filter = ("topic",)
    show_full_result_count = False
    paginator = EstimatedCountPaginator


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(StoredBodyMixin, ViewOnlyAdmin):
    """Every request that reached the webhook endpoint, verified or not."""

    list_display = ("received_at", "provider_shown", "verification", "rejection_reason", "http_status",
                    "claimed_event_id", "duplicate", "body_size", "remote_addr")
    list_filter = (ProviderFilter, "verification", "rejection_reason", "duplicate")
    search_fields = ("claimed_event_id", "body_sha256")
    show_full_result_count = False
    paginator = EstimatedCountPaginator

    @admin.display(description="provider", ordering="provider")
    def provider_shown(self, delivery: WebhookDelivery) -> str:
        return provider_label(delivery.provider)

from dunning.admin import operations as admin_operations  # noqa: E402, F401  (registers the operations pages)
