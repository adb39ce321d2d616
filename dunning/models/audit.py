"""Transition receipts (every accepted and rejected transition) and the transactional outbox."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from simple_history.models import HistoricalRecords

from dunning.append_only import AppendOnlyModel


class CauseKind(models.TextChoices):
    EVENT = "EVENT", "Provider event"
    JOB = "JOB", "Scheduled job"
    USER = "USER", "Staff member"
    CUSTOMER = "CUSTOMER", "Customer"
    SYSTEM = "SYSTEM", "System"


class TransitionReceipt(AppendOnlyModel):
    # No index of their own: receipt_sub_recent / receipt_cycle_recent lead with them.
    subscription = models.ForeignKey("subscriptions.Subscription", on_delete=models.PROTECT,
                                     related_name="transition_receipts", db_index=False)
    cycle = models.ForeignKey("dunning.DunningCycle", null=True, blank=True, on_delete=models.PROTECT,
                              related_name="transition_receipts", db_index=False)
    edge = models.CharField(max_length=64)
    accepted = models.BooleanField()
    from_state = models.CharField(max_length=32, blank=True, default="")
    to_state = models.CharField(max_length=32, blank=True, default="")
    rejection_reason = models.CharField(max_length=64, blank=True, default="", db_index=True)
    detail = models.TextField(blank=True, default="")
    cause_kind = models.CharField(max_length=16, choices=CauseKind.choices)
    cause_ref = models.CharField(max_length=255, blank=True, default="")
    actor = models.CharField(max_length=150)
    actor_user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.PROTECT, related_name="+")
    reason = models.TextField(blank=True, default="", help_text="Why a person did this.")
    ticket = models.CharField(max_length=128, blank=True, default="")
    expected = models.JSONField(default=dict, help_text="CAS inputs the caller expected.")
    observed = models.JSONField(default=dict, help_text="What the locked rows held.")
    cycle_generation = models.PositiveBigIntegerField(null=True, blank=True)
    root_before = models.CharField(max_length=64, blank=True, default="")
    root_after = models.CharField(max_length=64, blank=True, default="")
    decision_profile = models.CharField(max_length=32, blank=True, default="")
    entitlement_generation = models.PositiveBigIntegerField(null=True, blank=True)
    evidence_receipt = models.ForeignKey("dunning.ProviderReceipt", null=True, blank=True,
                                         on_delete=models.PROTECT, related_name="+")
    policy = models.ForeignKey("dunning.DunningPolicy", null=True, blank=True, on_delete=models.PROTECT,
                               related_name="+")
    trusted_time = models.DateTimeField()
    recorded_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            models.Index(fields=["subscription", "-id"], name="receipt_sub_recent"),
            models.Index(fields=["cycle", "-id"], name="receipt_cycle_recent"),
        ]

    def __str__(self) -> str:
        verdict = "accepted" if self.accepted else f"rejected ({self.rejection_reason})"
        return f"{self.edge} {self.from_state}→{self.to_state or '—'} {verdict}"


# The outbox topic of a new entitlement generation (consumed by dunning.actions.entitlement_changed).
ENTITLEMENT_CHANGED_TOPIC = "entitlement.changed"


class OutboxMessage(AppendOnlyModel):
    """Written in the acceptance transaction; relayed after commit, at least once."""

    MUTABLE_FIELDS = frozenset({"published_at", "delivery_attempts", "last_error", "claimed_until", "claimed_by"})

    topic = models.CharField(max_length=64)
    dedupe_key = models.CharField(max_length=255, unique=True)
    payload = models.JSONField()
    subscription = models.ForeignKey("subscriptions.Subscription", null=True, blank=True,
                                     on_delete=models.PROTECT, related_name="outbox_messages")
    receipt = models.ForeignKey(TransitionReceipt, null=True, blank=True, on_delete=models.PROTECT,
                                related_name="outbox_messages")
    created_at = models.DateTimeField()
    published_at = models.DateTimeField(null=True, blank=True)
    delivery_attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    claimed_until = models.DateTimeField(null=True, blank=True)
    claimed_by = models.CharField(max_length=128, blank=True, default="")

    history = HistoricalRecords()  # processing bookkeeping changes; the payload never does

    class Meta:
        indexes = [
            models.Index(fields=["created_at"], name="outbox_unpublished",
                         condition=models.Q(published_at__isnull=True)),
        ]

    def __str__(self) -> str:
        return f"{self.topic} {self.dedupe_key}"
