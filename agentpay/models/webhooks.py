"""Tenant callbacks: where a tenant wants its intents' changes POSTed, and what came of each POST.

The signing secret is shown once, like an API key, and not stored: it is derived from the
server's AGENTPAY_WEBHOOK_SIGNING_KEY and the endpoint's random salt, and only its digest is
kept (to tell that the derivation still gives the secret the tenant was shown).
"""

from __future__ import annotations

from django.db import models

from agentpay.models.append_only import AppendOnlyModel
from agentpay.models.audit import OutboxMessage
from agentpay.models.tenants import Tenant


class TenantWebhookEndpoint(models.Model):
    tenant = models.OneToOneField(Tenant, on_delete=models.PROTECT, related_name="webhook_endpoint")
    url = models.URLField(max_length=2000, help_text="Where the signed callbacks are POSTed.")
    secret_salt = models.CharField(max_length=64, help_text="Random; the secret is derived from it (not secret).")
    secret_prefix = models.CharField(max_length=16, help_text="The first characters, to tell secrets apart.")
    secret_hash = models.CharField(max_length=64, help_text="SHA-256 of the secret; the secret itself is not kept.")
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    secret_rotated_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.tenant.name} → {self.url}"


class WebhookDelivery(AppendOnlyModel):
    """One per (outbox message, tenant): the dedupe record. Delivered once; attempts until then."""

    MUTABLE_FIELDS = frozenset({"delivered_at", "attempts", "last_status", "last_error", "last_attempt_at"})

    message = models.ForeignKey(OutboxMessage, on_delete=models.PROTECT, related_name="webhook_deliveries")
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="webhook_deliveries")
    dedupe_key = models.CharField(max_length=255, help_text="The outbox row's; sent as AgentPay-Event-Id.")
    url = models.URLField(max_length=2000, help_text="The endpoint's URL when the delivery was first tried.")
    created_at = models.DateTimeField()
    delivered_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    last_status = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    last_attempt_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "webhook deliveries"
        constraints = [models.UniqueConstraint(fields=["message", "tenant"], name="one_webhook_delivery_per_tenant")]

    def __str__(self) -> str:
        return f"{self.dedupe_key} → {self.url} ({'delivered' if self.delivered_at else 'pending'})"


class WebhookAttempt(AppendOnlyModel):
    """One POST of a delivery and its HTTP outcome; never changed."""

    delivery = models.ForeignKey(WebhookDelivery, on_delete=models.PROTECT, related_name="attempt_rows")
    attempted_at = models.DateTimeField()
    url = models.URLField(max_length=2000)
    http_status = models.PositiveSmallIntegerField(null=True, blank=True, help_text="None: no HTTP answer.")
    latency_ms = models.PositiveIntegerField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    body_digest = models.CharField(max_length=64, help_text="SHA-256 of the body we sent.")
    signature_timestamp = models.PositiveBigIntegerField()

    def __str__(self) -> str:
        return f"{self.delivery.dedupe_key} → {self.http_status or self.error[:40]}"
