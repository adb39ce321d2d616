"""Alert deliveries (issue 19 item 2): one row per alert episode and channel, and one append-only
row per try, so the alert's page shows who was told, how, and what each try answered."""

from __future__ import annotations

from django.db import models

from dunning.append_only import AppendOnlyModel

# The outbox topic written in the transaction that raises an alert episode.
ALERT_RAISED_TOPIC = "alert.raised"


class AlertChannel(models.TextChoices):
    EMAIL = "EMAIL", "Email to the on-call list"
    WEBHOOK = "WEBHOOK", "Signed webhook (Slack-compatible)"


class AlertDeliveryStatus(models.TextChoices):
    PENDING = "PENDING", "Waiting for its first try"
    SENDING = "SENDING", "Being sent"
    RETRYING = "RETRYING", "Failed; tried again later"
    SENT = "SENT", "Sent"
    FAILED = "FAILED", "Failed; gave up"
    SKIPPED = "SKIPPED", "Not sent"


FINAL_DELIVERY_STATUSES = frozenset({AlertDeliveryStatus.SENT, AlertDeliveryStatus.FAILED,
                                     AlertDeliveryStatus.SKIPPED})


class AlertDelivery(AppendOnlyModel):
    """Telling a person about one alert episode over one channel. The unique (alert, channel) pair
    is the deduplication: an episode is announced once per channel, whoever asks how often."""

    MUTABLE_FIELDS = frozenset({"status", "attempts", "next_attempt_at", "last_attempt_at", "last_status_code",
                                "last_error", "sent_at", "target"})

    alert = models.ForeignKey("dunning.Alert", on_delete=models.PROTECT, related_name="deliveries")
    channel = models.CharField(max_length=16, choices=AlertChannel.choices)
    message = models.ForeignKey("dunning.OutboxMessage", on_delete=models.PROTECT, related_name="alert_deliveries")
    status = models.CharField(max_length=16, choices=AlertDeliveryStatus.choices, default=AlertDeliveryStatus.PENDING)
    target = models.CharField(max_length=1000, blank=True, default="",
                              help_text="The recipients, or the webhook's scheme and host (its path may hold a "
                                        "secret, so it is not stored).")
    attempts = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField()
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "alert deliveries"
        constraints = [models.UniqueConstraint(fields=["alert", "channel"], name="one_alert_delivery_per_channel")]
        indexes = [models.Index(fields=["next_attempt_at"], name="alert_delivery_due",
                                condition=models.Q(status__in=["PENDING", "RETRYING", "SENDING"]))]

    def __str__(self) -> str:
        return f"alert {self.alert_id} by {self.channel}: {self.status}"


class AlertDeliveryAttempt(AppendOnlyModel):
    """One try of one delivery, written once when the try ends."""

    delivery = models.ForeignKey(AlertDelivery, on_delete=models.PROTECT, related_name="tries")
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()
    outcome = models.CharField(max_length=16)  # SENT | RETRY | FAILED
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.TextField(blank=True, default="")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["delivery", "number"], name="one_alert_delivery_try_number")]

    def __str__(self) -> str:
        return f"try {self.number} of delivery {self.delivery_id}: {self.outcome}"
