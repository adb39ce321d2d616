from django.contrib import admin
from simple_history.admin import SimpleHistoryAdmin

from dunning.admin_base import ViewOnlyAdmin, ViewOnlyInline
from dunning.models import DunningCycle
from entitlements.models import EntitlementSnapshot
from subscriptions.models import Customer, Invoice, Subscription


class CycleInline(ViewOnlyInline):
    model = DunningCycle
    fields = ("cycle_id", "invoice", "state", "generation", "failure_class", "grace_expires_at", "next_attempt_at")
    readonly_fields = fields


class SnapshotInline(ViewOnlyInline):
    model = EntitlementSnapshot
    fields = ("generation", "profile", "reason", "issued_at")
    readonly_fields = fields
    ordering = ("-generation",)
    show_change_link = False


@admin.register(Subscription)
class SubscriptionAdmin(ViewOnlyAdmin, SimpleHistoryAdmin):
    list_display = ("provider_subscription_id", "customer", "policy", "entitlement_profile",
                    "entitlement_generation", "provider_status", "updated_at")
    list_filter = ("entitlement_profile", "policy", "billing_interval", "cohort")
    list_select_related = ("customer", "policy")
    search_fields = ("provider_subscription_id", "customer__email", "customer__provider_customer_id")
    inlines = [CycleInline, SnapshotInline]


@admin.register(Invoice)
class InvoiceAdmin(ViewOnlyAdmin, SimpleHistoryAdmin):
    list_display = ("provider_invoice_id", "subscription", "status", "amount_due", "currency", "revision",
                    "attempt_count", "next_payment_attempt")
    list_filter = ("status", "currency")
    list_select_related = ("subscription",)
    search_fields = ("provider_invoice_id", "subscription__provider_subscription_id")


@admin.register(Customer)
class CustomerAdmin(SimpleHistoryAdmin):
    list_display = ("email", "name", "provider_customer_id", "user")
    search_fields = ("email", "provider_customer_id", "name")
    list_select_related = ("user",)
