"""Evidence: the provider-event inbox, fresh provider receipts and append-only money facts."""

from __future__ import annotations

from django.db import models
from django.db.models import Expression
from django.db.models.fields.json import KeyTransform
from django.db.models.functions import JSONObject

from dunning.append_only import AppendOnlyModel


class EventOutcome(models.TextChoices):
    PENDING = "PENDING"
    APPLIED = "APPLIED"
    DUPLICATE = "DUPLICATE"
    NO_CHANGE = "NO_CHANGE"
    QUARANTINED = "QUARANTINED"
    UNATTRIBUTABLE = "UNATTRIBUTABLE"
    IGNORED = "IGNORED"
    FAILED = "FAILED"


# Stored event types that say an invoice was paid, every adapter's (`paid_event_types`; Stripe's
# invoice events, Alipay's successful trade notifications). Spelled out here because models import
# no adapter; tests/providers_alipay checks this is exactly the adapters' union.
PAID_EVENT_TYPES = ("invoice.paid", "invoice.payment_succeeded", "trade_status_sync.TRADE_SUCCESS",
                    "trade_status_sync.TRADE_FINISHED")


class ProviderEvent(AppendOnlyModel):
    """Inbox row, unique per (provider, event id). The raw payload never changes; only the
    processing bookkeeping does."""

    MUTABLE_FIELDS = frozenset(
        {"processed_at", "outcome", "outcome_detail", "subscription", "invoice", "cycle", "attempts", "error"}
    )
    RAW_BODY_FIELD = "payload"  # cut to its ids by the retention job only (AppendOnlyQuerySet.purge_raw_body)

    provider = models.CharField(max_length=32, default="stripe")
    event_id = models.CharField(max_length=255)
    event_type = models.CharField(max_length=128)
    api_version = models.CharField(max_length=32, blank=True, default="")
    account = models.CharField(max_length=255, blank=True, default="")
    payload = models.JSONField()
    signature_verified = models.BooleanField(default=False)
    provider_created_at = models.DateTimeField(null=True, blank=True)
    received_at = models.DateTimeField()
    processed_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=EventOutcome.choices, default=EventOutcome.PENDING)
    outcome_detail = models.TextField(blank=True, default="")
    subscription = models.ForeignKey("subscriptions.Subscription", null=True, blank=True,
                                     on_delete=models.PROTECT, related_name="provider_events")
    invoice = models.ForeignKey("subscriptions.Invoice", null=True, blank=True,
                                on_delete=models.PROTECT, related_name="provider_events")
    cycle = models.ForeignKey("dunning.DunningCycle", null=True, blank=True,
                              on_delete=models.PROTECT, related_name="provider_events")
    attempts = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True, default="")
    body_purged_at = models.DateTimeField(null=True, blank=True,
                                          help_text="When the retention job cut the payload to its ids.")

    # No django-simple-history here: the row is its own record. The payload never changes; the
    # bookkeeping goes PENDING -> an outcome once (event_process leaves a processed event alone,
    # retries before that only count attempts and keep the last error), and any later change is a
    # staff re-processing, whose EventReprocessing row keeps who, why, the outcome before and after.
    # A history row per inbox insert was the largest single cost of a webhook delivery.

    class Meta:
        constraints = [models.UniqueConstraint(fields=["provider", "event_id"], name="uniq_provider_event")]
        indexes = [models.Index(fields=["outcome", "received_at"], name="event_outcome_received")]

    def __str__(self) -> str:
        return f"{self.event_type} {self.event_id}"

    @staticmethod
    def purged_raw_body() -> Expression:
        """A purged payload keeps only what names the event and its object (`id`, `type`,
        `data.object.id` / `.object`): the gates and alerts look events up by that object id, and
        the admin names it. Nothing else of the body survives."""
        obj = KeyTransform("object", KeyTransform("data", "payload"))
        return JSONObject(id=KeyTransform("id", "payload"), type=KeyTransform("type", "payload"),
                          data=JSONObject(object=JSONObject(id=KeyTransform("id", obj),
                                                            object=KeyTransform("object", obj))))


class ProviderReceipt(AppendOnlyModel):
    """One fresh fetch of a provider object. Restriction and cancellation cite one.

    `body` is the desensitised form of what was fetched, `body_digest` the digest of the body as
    fetched; the retention job empties `body` (status, amount, currency and digest stay)."""

    RAW_BODY_FIELD = "body"  # emptied by the retention job only (AppendOnlyQuerySet.purge_raw_body)

    provider = models.CharField(max_length=32, default="stripe")
    object_type = models.CharField(max_length=32)  # invoice | payment_intent | charge | dispute | subscription
    object_id = models.CharField(max_length=255, db_index=True)
    account = models.CharField(max_length=255, blank=True, default="")
    status = models.CharField(max_length=32)
    amount = models.BigIntegerField(null=True, blank=True)
    currency = models.CharField(max_length=3, blank=True, default="")
    body = models.JSONField()
    body_digest = models.CharField(max_length=64)
    fetched_at = models.DateTimeField()
    # No index of its own: receipt_invoice_fetched leads with it.
    invoice = models.ForeignKey("subscriptions.Invoice", null=True, blank=True,
                                on_delete=models.PROTECT, related_name="receipts", db_index=False)
    cause_event = models.ForeignKey(ProviderEvent, null=True, blank=True,
                                    on_delete=models.PROTECT, related_name="receipts")
    body_purged_at = models.DateTimeField(null=True, blank=True,
                                          help_text="When the retention job emptied the body (the digest stays).")

    class Meta:
        indexes = [models.Index(fields=["invoice", "-fetched_at"], name="receipt_invoice_fetched")]

    @staticmethod
    def purged_raw_body() -> dict:
        return {}

    def __str__(self) -> str:
        return f"{self.object_type} {self.object_id} {self.status} @ {self.fetched_at:%Y-%m-%d %H:%M:%S}"


class FactKind(models.TextChoices):
    PAYMENT_FAILED = "PAYMENT_FAILED"
    PAYMENT_SUCCEEDED = "PAYMENT_SUCCEEDED"
    INVOICE_VOIDED = "INVOICE_VOIDED"
    MARKED_UNCOLLECTIBLE = "MARKED_UNCOLLECTIBLE"
    REFUNDED = "REFUNDED"
    DISPUTE_OPENED = "DISPUTE_OPENED"
    DISPUTE_WON = "DISPUTE_WON"
    DISPUTE_LOST = "DISPUTE_LOST"
    # Money a dispute moved, one fact per balance transaction of the fetched dispute: withdrawn
    # from our balance when the chargeback opened, reinstated when it was won.
    DISPUTE_FUNDS_WITHDRAWN = "DISPUTE_FUNDS_WITHDRAWN"
    DISPUTE_FUNDS_REINSTATED = "DISPUTE_FUNDS_REINSTATED"


class MonetaryFact(AppendOnlyModel):
    """Append-only money fact. `dedupe_key` makes the same provider fact land once.

    Amounts add up: summing an invoice's facts of one kind gives the money of that kind. A
    refund fact holds the *increment* refunded; the charge's cumulative refunded total the
    provider showed (the evidence the increment was derived from) is `cumulative_amount`.
    `attempt` is the payment attempt the money came from, when one was recorded."""

    kind = models.CharField(max_length=32, choices=FactKind.choices)
    invoice = models.ForeignKey("subscriptions.Invoice", on_delete=models.PROTECT, related_name="facts")
    cycle = models.ForeignKey("dunning.DunningCycle", null=True, blank=True,
                              on_delete=models.PROTECT, related_name="facts")
    attempt = models.ForeignKey("dunning.PaymentAttempt", null=True, blank=True,
                                on_delete=models.PROTECT, related_name="facts")
    amount = models.BigIntegerField()
    cumulative_amount = models.BigIntegerField(
        null=True, blank=True,
        help_text="REFUNDED: the charge's cumulative refunded total on the receipt this increment was derived from.")
    currency = models.CharField(max_length=3)
    provider_ref = models.CharField(max_length=255, blank=True, default="")
    decline_code = models.CharField(max_length=64, blank=True, default="")
    receipt = models.ForeignKey(ProviderReceipt, null=True, blank=True, on_delete=models.PROTECT, related_name="facts")
    dedupe_key = models.CharField(max_length=255, unique=True)
    occurred_at = models.DateTimeField()
    recorded_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["invoice", "kind"], name="fact_invoice_kind")]

    def __str__(self) -> str:
        return f"{self.kind} {self.amount} {self.currency.upper()}"
