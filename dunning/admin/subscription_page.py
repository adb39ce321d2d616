from django.contrib import admin
from django.db.models import Count, Min, Q
from django.utils import timezone
from django.utils.timesince import timesince
from simple_history.admin import SimpleHistoryAdmin

from dunning.admin.base import ViewOnlyAdmin, ViewOnlyInline
from dunning.admin.decisions import ConsoleActionsMixin, allowed_actions
from dunning.admin.filters import CycleStateFilter, ProviderFilter, SubscriptionAgeFilter, SubscriptionOwnerFilter
from dunning.admin.timeline import subscription_console
from dunning.admin.usage_section import usage_section
from dunning.states import DELINQUENT_STATES
from entitlements.models import EntitlementSnapshot
from subscriptions.models import Customer, Invoice, Subscription
from subscriptions.providers.labels import provider_terms, provider_with_account


class SnapshotInline(ViewOnlyInline):
    model = EntitlementSnapshot
    fields = ("generation", "profile", "reason", "issued_at")
    readonly_fields = fields
    ordering = ("-generation",)
    show_change_link = False
    classes = ("collapse",)


@admin.register(Subscription)
class SubscriptionAdmin(ConsoleActionsMixin, ViewOnlyAdmin, SimpleHistoryAdmin):
    """The support console's subscription page (SPEC §11): blocking cycles, root, access,
    verdict and one timeline above the fields, with the staff decisions the user may take."""

    list_display = ("provider_subscription_id", "provider_shown", "customer_email", "policy", "entitlement_profile",
                    "entitlement_generation", "blocking_cycles", "open_since", "provider_status")
    list_filter = (CycleStateFilter, ProviderFilter, "policy", SubscriptionOwnerFilter, SubscriptionAgeFilter,
                   "entitlement_profile", "billing_interval", "cohort")
    list_select_related = ("customer", "policy")
    search_fields = ("provider_subscription_id", "customer__email", "customer__provider_customer_id",
                     "invoices__provider_invoice_id")
    search_help_text = "Customer email, or a provider id (subscription, customer, invoice)."
    inlines = [SnapshotInline]
    change_form_template = "admin/subscriptions/subscription/change_form.html"
    show_full_result_count = False

    def get_queryset(self, request):
        open_debt = Q(cycles__state__in=DELINQUENT_STATES)
        return super().get_queryset(request).annotate(
            blocking_count=Count("cycles", filter=open_debt), oldest_open=Min("cycles__opened_at", filter=open_debt))

    @admin.display(description="provider", ordering="provider")
    def provider_shown(self, sub: Subscription) -> str:
        return provider_with_account(sub.provider, sub.provider_account)

    @admin.display(description="customer", ordering="customer__email")
    def customer_email(self, sub: Subscription) -> str:
        return sub.customer.email

    @admin.display(description="open cycles", ordering="blocking_count")
    def blocking_cycles(self, sub: Subscription) -> int:
        return sub.blocking_count

    @admin.display(description="debt open for", ordering="oldest_open")
    def open_since(self, sub: Subscription) -> str:
        return timesince(sub.oldest_open, timezone.now()) if sub.oldest_open else "—"

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra_context = dict(extra_context or {})
        sub = Subscription.objects.select_related("customer", "policy").filter(pk=object_id).first()
        if sub is not None:
            extra_context.update(subscription_console(sub, allowed=allowed_actions(request.user)))
            extra_context.update(usage_section(sub))
        return super().change_view(request, object_id, form_url, extra_context)


@admin.register(Invoice)
class InvoiceAdmin(ViewOnlyAdmin, SimpleHistoryAdmin):
    list_display = ("provider_invoice_id", "kind", "provider_shown", "subscription", "status", "amount_due",
                    "currency", "revision", "attempt_count", "next_payment_attempt")
    list_filter = (ProviderFilter, "status", "currency")
    list_select_related = ("subscription",)
    search_fields = ("provider_invoice_id", "subscription__provider_subscription_id", "subscription__customer__email")

    @admin.display(description="provider", ordering="provider")
    def provider_shown(self, invoice: Invoice) -> str:
        return provider_with_account(invoice.provider, invoice.subscription.provider_account)

    @admin.display(description="kind")
    def kind(self, invoice: Invoice) -> str:
        """ "invoice" (Stripe) or "deduction order" (Alipay)."""
        return provider_terms(invoice.provider).invoice


@admin.register(Customer)
class CustomerAdmin(SimpleHistoryAdmin):
    list_display = ("email", "name", "provider_customer_id", "user")
    search_fields = ("email", "provider_customer_id", "name")
    list_select_related = ("user",)
