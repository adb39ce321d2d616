"""Every webhook request exactly as it arrived, written once with its verdict.

A delivery that fails verification is kept (with why), so nothing a provider or an attacker
sent is lost; a verified one points at its deduplicated ProviderEvent, committed with it. The
verdict is reached in memory first, so only a process killed between receiving a request and
writing it (a gunicorn timeout, an OOM kill) leaves no row; the provider then got no 2xx and
delivers again.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from dunning.append_only import AppendOnlyModel


class Verification(models.TextChoices):
    PENDING = "PENDING"
    VERIFIED = "VERIFIED"
    REJECTED = "REJECTED"


class WebhookDelivery(AppendOnlyModel):
    MUTABLE_FIELDS: frozenset[str] = frozenset()  # written once, verdict included
    RAW_BODY_FIELD = "body"  # emptied by the retention job only (AppendOnlyQuerySet.purge_raw_body)

    provider = models.CharField(max_length=32, default="stripe")
    received_at = models.DateTimeField(db_index=True)
    remote_addr = models.GenericIPAddressField(null=True, blank=True)
    headers = models.JSONField(default=dict)
    body = models.BinaryField(help_text="The body as received (cut at the size limit), desensitised "
                                        "(dunning.privacy); emptied when purged.")
    body_size = models.PositiveIntegerField(help_text="Declared or read size in bytes.")
    body_sha256 = models.CharField(max_length=64)
    truncated = models.BooleanField(default=False)
    verification = models.CharField(max_length=16, choices=Verification.choices, default=Verification.PENDING)
    rejection_reason = models.CharField(max_length=64, blank=True, default="", db_index=True)
    detail = models.TextField(blank=True, default="")
    http_status = models.PositiveSmallIntegerField(null=True, blank=True)
    claimed_event_id = models.CharField(max_length=255, blank=True, default="", db_index=True)
    duplicate = models.BooleanField(default=False)
    event = models.ForeignKey("dunning.ProviderEvent", null=True, blank=True, on_delete=models.PROTECT,
                              related_name="deliveries")
    body_purged_at = models.DateTimeField(null=True, blank=True,
                                          help_text="When the retention job emptied the body (the digest stays).")

    class Meta:
        verbose_name_plural = "webhook deliveries"

    @staticmethod
    def purged_raw_body() -> bytes:
        return b""

    def __str__(self) -> str:
        return f"{self.provider} delivery {self.pk} {self.verification} {self.claimed_event_id}"


class ReprocessingStatus(models.TextChoices):
    STARTED = "STARTED", "Started"
    DONE = "DONE", "Done"
    PROVIDER_UNAVAILABLE = "PROVIDER_UNAVAILABLE", "Provider did not answer"
    FAILED = "FAILED", "Failed on our side"
    ABANDONED = "ABANDONED", "Abandoned (the process stopped)"


class EventReprocessing(AppendOnlyModel):
    """One staff request to fetch a held (quarantined or unattributable) provider event's objects
    again and process it once more (`dunning.evidence.reprocessing`).

    The row is written *before* processing, with what the event's outcome was, so the first
    verdict stays on record whatever happens next (the event row itself only holds its current
    bookkeeping); the result is added when processing ends. Never deleted.
    """

    MUTABLE_FIELDS = frozenset({"status", "new_outcome", "new_detail", "finished_at", "error"})

    event = models.ForeignKey("dunning.ProviderEvent", on_delete=models.PROTECT, related_name="reprocessings")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    actor = models.CharField(max_length=150, help_text="The requesting user's name, as it was then.")
    reason = models.TextField()
    ticket = models.CharField(max_length=128)
    requested_at = models.DateTimeField(help_text="Trusted time the request was accepted.")
    previous_outcome = models.CharField(max_length=16)
    previous_detail = models.TextField(blank=True, default="")
    previous_processed_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=24, choices=ReprocessingStatus.choices, default=ReprocessingStatus.STARTED)
    new_outcome = models.CharField(max_length=16, blank=True, default="")
    new_detail = models.TextField(blank=True, default="")
    finished_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True, default="")

    class Meta:
        verbose_name = "event re-processing"
        constraints = [
            # At most one re-processing of an event runs at a time.
            models.UniqueConstraint(fields=["event"], condition=models.Q(status="STARTED"),
                                    name="one_reprocessing_in_flight"),
        ]
        indexes = [models.Index(fields=["event", "-requested_at"], name="reprocessing_event_recent")]

    def __str__(self) -> str:
        after = self.new_outcome or self.get_status_display().lower()
        return f"re-processing of event {self.event_id} by {self.actor}: {self.previous_outcome} → {after}"
