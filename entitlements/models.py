"""Issued entitlement snapshots (append-only, one per generation of a subscription) and the REST
API's own tables: service tokens, idempotency records, push subscribers and deliveries."""

from __future__ import annotations

from django.db import models

from dunning.append_only import AppendOnlyModel


class EntitlementSnapshot(AppendOnlyModel):
    subscription = models.ForeignKey(
        "subscriptions.Subscription", on_delete=models.PROTECT, related_name="entitlement_snapshots"
    )
    generation = models.PositiveBigIntegerField()
    profile = models.CharField(max_length=32)
    capabilities = models.JSONField()
    reason = models.CharField(max_length=255)
    issued_at = models.DateTimeField()
    cause_receipt = models.ForeignKey(
        "dunning.TransitionReceipt", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["subscription", "generation"], name="uniq_snapshot_generation")
        ]
        ordering = ["subscription_id", "-generation"]
        get_latest_by = "generation"

    def __str__(self) -> str:
        return f"{self.subscription_id}@{self.generation} {self.profile}"


# --- REST API (SPEC §13): service tokens, idempotency records, entitlement push ------------------

API_PERMISSIONS = (
    ("api_read", "Read billing state through the API"),
    ("api_grant_exception", "Grant a dunning exception through the API"),
    ("api_retry_payment", "Retry a payment now through the API"),
    ("api_publish_policy", "Publish a dunning policy through the API"),
)


class ServiceToken(models.Model):
    """A runtime service's credential. Only a SHA-256 digest of the token is stored: tokens are
    32 random bytes, so a fast hash is enough (no password stretching needed) and lookup stays
    an indexed equality. The token itself is printed once, at creation.

    `provider_account` / `cohort`, when set, restrict which subscriptions the token may see;
    anything outside is answered 404, as if it did not exist. The custom permissions of the
    staff roles live on this model's Meta (granted to the two groups by a data migration)."""

    name = models.CharField(max_length=100, unique=True)
    prefix = models.CharField(max_length=16, help_text="First characters of the token, to recognise it.")
    token_hash = models.CharField(max_length=64, unique=True)
    scopes = models.JSONField(default=list)
    provider_account = models.CharField(max_length=255, blank=True, default="")
    cohort = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField()
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        permissions = API_PERMISSIONS

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class IdempotencyState(models.TextChoices):
    IN_FLIGHT = "IN_FLIGHT", "In flight"
    DONE = "DONE", "Done"


class IdempotencyRecord(models.Model):
    """One claimed `Idempotency-Key` per principal: claimed in its own committed transaction
    before the service runs, then completed with the response that is replayed to repeats."""

    principal = models.CharField(max_length=64)
    key = models.CharField(max_length=255)
    request_digest = models.CharField(max_length=64, help_text="SHA-256 of method, path and body.")
    state = models.CharField(max_length=16, choices=IdempotencyState.choices, default=IdempotencyState.IN_FLIGHT)
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    response_body = models.JSONField(null=True, blank=True)
    response_content_type = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField()
    completed_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["principal", "key"], name="uniq_idempotency_principal_key")]

    def __str__(self) -> str:
        return f"{self.principal} {self.key} {self.state}"


class EntitlementSubscriber(models.Model):
    """A URL that receives signed `entitlement.changed` pushes. An empty cohort means all."""

    name = models.CharField(max_length=100, unique=True)
    url = models.URLField(max_length=1000)
    secret = models.CharField(max_length=255, help_text="Shared HMAC-SHA256 secret for Dunning-Signature.")
    active = models.BooleanField(default=True)
    cohort = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class DeliveryStatus(models.TextChoices):
    PENDING = "PENDING", "Pending"
    DELIVERED = "DELIVERED", "Delivered"
    GAVE_UP = "GAVE_UP", "Gave up"


class EntitlementDelivery(models.Model):
    """One push of one outbox message to one subscriber, retried on its own with back-off, so
    a failing subscriber never causes a resend to the others."""

    message = models.ForeignKey("dunning.OutboxMessage", on_delete=models.PROTECT, related_name="+")
    subscriber = models.ForeignKey(EntitlementSubscriber, on_delete=models.CASCADE, related_name="deliveries")
    status = models.CharField(max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField()
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["message", "subscriber"], name="uniq_delivery_message_subscriber")
        ]
        indexes = [
            models.Index(fields=["next_attempt_at"], name="delivery_pending_due",
                         condition=models.Q(status="PENDING")),
        ]
        verbose_name_plural = "entitlement deliveries"

    def __str__(self) -> str:
        return f"{self.message_id} → {self.subscriber_id} {self.status}"
