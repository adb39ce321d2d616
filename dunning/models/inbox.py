"""Every webhook request exactly as it arrived, written once with its verdict.

A delivery that fails verification is kept (with why), so nothing a provider or an attacker
sent is lost; a verified one points at its deduplicated ProviderEvent, committed with it. The
verdict is reached in memory first, so only a process killed between receiving a request and
writing it (a gunicorn timeout, an OOM kill) leaves no row; the provider then got no 2xx and
delivers again.
"""

from __future__ import annotations

from django.db import models

from dunning.append_only import AppendOnlyModel


class Verification(models.TextChoices):
    PENDING = "PENDING"
    VERIFIED = "VERIFIED"
    REJECTED = "REJECTED"


class WebhookDelivery(AppendOnlyModel):
    MUTABLE_FIELDS: frozenset[str] = frozenset()  # written once, verdict included

    provider = models.CharField(max_length=32, default="stripe")
    received_at = models.DateTimeField(db_index=True)
    remote_addr = models.GenericIPAddressField(null=True, blank=True)
    headers = models.JSONField(default=dict)
    body = models.BinaryField(help_text="Raw body as received (cut at the size limit).")
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

    class Meta:
        verbose_name_plural = "webhook deliveries"

    def __str__(self) -> str:
        return f"{self.provider} delivery {self.pk} {self.verification} {self.claimed_event_id}"
