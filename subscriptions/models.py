"""Customers, subscriptions and the local mirror of the provider's invoices (SPEC §3)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from simple_history.models import HistoricalRecords

from dunning.append_only import AppendOnlyModel
from entitlements.profiles import FULL


class Customer(models.Model):
    provider = models.CharField(max_length=32, default="stripe")
    provider_customer_id = models.CharField(max_length=255, blank=True, default="")
    email = models.EmailField(db_index=True)
    name = models.CharField(max_length=255, blank=True, default="")
    # The customer's own login for the billing pages; staff never use it.
    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="customer"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    history = HistoricalRecords()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["provider", "provider_customer_id"],
                condition=~models.Q(provider_customer_id=""),
                name="uniq_provider_customer",
            )
        ]

    def __str__(self) -> str:
        return self.email or self.provider_customer_id


class BillingInterval(models.TextChoices):
    MONTH = "month", "Monthly"
    YEAR = "year", "Annual"


class Subscription(models.Model):
    """The aggregate root of access. Only the acceptance service writes the root and entitlement."""

    customer = models.ForeignKey(Customer, on_delete=models.PROTECT, related_name="subscriptions")
    provider = models.CharField(max_length=32, default="stripe")
    provider_account = models.CharField(max_length=255)
    provider_subscription_id = models.CharField(max_length=255)
    # --- The contract line (seed 002's Contract/Subscription machine), mirrored only from fresh
    # provider fetches through the subscription's acceptance (`contract_update`). ---
    provider_status = models.CharField(max_length=32, default="active", help_text="The provider's contract status.")
    cancel_at_period_end = models.BooleanField(default=False)
    current_period_end = models.DateTimeField(null=True, blank=True)
    contract_ended_at = models.DateTimeField(
        null=True, blank=True, help_text="When the provider ended the contract (ended_at, else canceled_at).")
    pause_behavior = models.CharField(max_length=32, blank=True, default="",
                                      help_text="Collection paused (pause_collection or status paused); '' if not.")
    pause_resumes_at = models.DateTimeField(null=True, blank=True)
    trial_end = models.DateTimeField(null=True, blank=True)
    contract_phase = models.CharField(
        max_length=32, default="active", db_index=True,
        help_text="The contract state the last acceptance decided access on (an ended contract reads 'canceled').")
    contract_revision = models.PositiveBigIntegerField(
        default=0, help_text="Rises with every accepted contract change.")
    contract_fetched_at = models.DateTimeField(
        null=True, blank=True, help_text="Fetch time of the newest provider read applied; an older read is refused.")
    # A dunning cancellation carried to the provider (outbox, idempotency key, receipt of its answer).
    provider_cancel_requested_at = models.DateTimeField(null=True, blank=True)
    provider_cancel_confirmed_at = models.DateTimeField(null=True, blank=True)
    price_id = models.CharField(max_length=255, help_text="Provider price id (a legacy plan id counts).")
    plan_name = models.CharField(max_length=255, blank=True, default="",
                                 help_text="The price's product name, as the provider named it at the last plan read.")
    cohort = models.CharField(max_length=64, default="default")
    billing_interval = models.CharField(max_length=8, choices=BillingInterval.choices, default=BillingInterval.MONTH)
    policy = models.ForeignKey("dunning.DunningPolicy", on_delete=models.PROTECT, related_name="subscriptions")
    outstanding_cycle_root = models.CharField(max_length=64)
    entitlement_profile = models.CharField(max_length=32, default=FULL)
    entitlement_generation = models.PositiveBigIntegerField(default=0)
    row_version = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    history = HistoricalRecords()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["provider", "provider_subscription_id"], name="uniq_provider_subscription")
        ]

    def __str__(self) -> str:
        return self.provider_subscription_id


class InvoiceStatus(models.TextChoices):
    DRAFT = "draft"
    OPEN = "open"
    PAID = "paid"
    VOID = "void"
    UNCOLLECTIBLE = "uncollectible"


class Invoice(models.Model):
    """Mirror of a provider invoice. `revision` rises whenever a fresh receipt changes it."""

    provider = models.CharField(max_length=32, default="stripe")
    provider_invoice_id = models.CharField(max_length=255)
    subscription = models.ForeignKey(Subscription, on_delete=models.PROTECT, related_name="invoices")
    amount_due = models.BigIntegerField(help_text="Minor units (cents).")
    amount_paid = models.BigIntegerField(default=0)
    currency = models.CharField(max_length=3, help_text="ISO 4217, lower case as the provider sends it.")
    status = models.CharField(max_length=16, choices=InvoiceStatus.choices, default=InvoiceStatus.OPEN)
    revision = models.PositiveBigIntegerField(default=1)
    attempt_count = models.PositiveIntegerField(default=0)
    next_payment_attempt = models.DateTimeField(null=True, blank=True)
    period_start = models.DateTimeField(null=True, blank=True)
    period_end = models.DateTimeField(null=True, blank=True)
    hosted_invoice_url = models.URLField(blank=True, default="", max_length=1000)
    price_ids = models.JSONField(default=list, blank=True,
                                 help_text="Prices (legacy plan ids included) of the invoice's own lines.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    history = HistoricalRecords()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["provider", "provider_invoice_id"], name="uniq_provider_invoice"),
            models.CheckConstraint(condition=models.Q(amount_due__gte=0), name="invoice_amount_non_negative"),
        ]

    def __str__(self) -> str:
        return self.provider_invoice_id


class UsageMetric(models.TextChoices):
    """What a producer counts. New metrics are new choices (a state-only migration, no table change)."""

    TOKENS = "tokens", "Tokens"
    CALLS = "calls", "Calls"


class UsageRecord(AppendOnlyModel):
    """Usage a producer (an API client) reported for a subscription: tokens or calls and their cost.

    Kept apart from subscription debt (seed 003: a failed payment must never lose usage already
    consumed): no dunning cycle reads or writes it, it is accepted in every entitlement profile,
    and it is never edited or deleted. The one later change is the provider invoicing it
    (`invoiced_at`, `provider_invoice_id`), set once by `subscriptions.usage.usage_mark_invoiced`.
    """

    MUTABLE_FIELDS = frozenset({"invoiced_at", "provider_invoice_id"})

    subscription = models.ForeignKey(Subscription, on_delete=models.PROTECT, related_name="usage_records")
    producer = models.ForeignKey("entitlements.ServiceToken", on_delete=models.PROTECT, related_name="usage_records",
                                 help_text="The API client that reported the usage.")
    producer_record_id = models.CharField(
        max_length=255, help_text="The producer's own id for the record: the idempotency key, with the producer.")
    metric = models.CharField(max_length=32, choices=UsageMetric.choices)
    quantity = models.PositiveBigIntegerField()
    cost = models.BigIntegerField(help_text="Minor units (cents) of `currency`.")
    currency = models.CharField(max_length=3, help_text="ISO 4217, lower case, the subscription's billing currency.")
    occurred_at = models.DateTimeField(help_text="When the producer says the usage happened.")
    received_at = models.DateTimeField(help_text="When we recorded it (trusted clock).")
    body_digest = models.CharField(max_length=64, help_text="SHA-256 of the canonical record; a replay must match it.")
    invoiced_at = models.DateTimeField(null=True, blank=True)
    provider_invoice_id = models.CharField(max_length=255, blank=True, default="",
                                           help_text="The provider invoice that bills this usage; empty until then.")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["producer", "producer_record_id"], name="uniq_usage_producer_record"),
            models.CheckConstraint(condition=models.Q(quantity__gt=0), name="usage_quantity_positive"),
            models.CheckConstraint(condition=models.Q(cost__gte=0), name="usage_cost_non_negative"),
            models.CheckConstraint(
                condition=models.Q(invoiced_at__isnull=True, provider_invoice_id="")
                | (models.Q(invoiced_at__isnull=False) & ~models.Q(provider_invoice_id="")),
                name="usage_invoiced_both_or_neither"),
        ]
        indexes = [models.Index(fields=["subscription", "occurred_at"], name="usage_subscription_occurred")]
        ordering = ["-occurred_at", "-pk"]

    def __str__(self) -> str:
        return f"{self.quantity} {self.metric} for {self.subscription_id} ({self.producer_record_id})"


# The Alipay adapter's merchant-side records (Django finds models through this module).
from subscriptions.providers.alipay.records import AlipayAgreement, AlipayRenewalOrder, AlipayTrade  # noqa: E402

__all__ = ["AlipayAgreement", "AlipayRenewalOrder", "AlipayTrade"]  # re-exported for the app registry
