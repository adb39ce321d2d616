"""Receipts (every accepted and rejected event), the outbox, and the gateway's request log."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from agentpay.models.append_only import AppendOnlyModel
from agentpay.models.payments import PaymentIntent
from agentpay.models.tenants import PricedRoute, Tenant


class CauseKind(models.TextChoices):
    REQUEST = "request", "Gateway request"
    JOB = "job", "Scheduled job"
    USER = "user", "Staff member"
    SYSTEM = "system", "System"


class IntentReceipt(AppendOnlyModel):
    """Who asked what of which line, when, and what came of it; written for refusals too."""

    # Indexed by receipt_intent_timeline (intent, id), not on its own: seven receipts a paid call.
    intent = models.ForeignKey(PaymentIntent, on_delete=models.PROTECT, related_name="receipts", db_index=False)
    line = models.CharField(max_length=16)
    event = models.CharField(max_length=64)
    accepted = models.BooleanField()
    from_state = models.CharField(max_length=16, blank=True, default="")
    to_state = models.CharField(max_length=16, blank=True, default="")
    generation = models.PositiveBigIntegerField(help_text="The intent's generation after the step (before if refused).")
    refusal_code = models.CharField(max_length=64, blank=True, default="")
    detail = models.TextField(blank=True, default="")
    data = models.JSONField(default=dict)
    cause_kind = models.CharField(max_length=16, choices=CauseKind.choices)
    actor = models.CharField(max_length=150)
    actor_user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT,
                                   related_name="+", db_index=False)
    request_id = models.UUIDField(null=True, blank=True)
    reason = models.TextField(blank=True, default="")
    ticket = models.CharField(max_length=128, blank=True, default="")
    trusted_time = models.DateTimeField()
    recorded_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        # Partial where most receipts hold nothing to find: an accepted step has no refusal code,
        # and a request's or a job's no person (index entries cost every paid call's receipts).
        indexes = [models.Index(fields=["intent", "id"], name="receipt_intent_timeline"),
                   models.Index(fields=["refusal_code"], name="receipt_refusals", condition=~Q(refusal_code="")),
                   models.Index(fields=["actor_user"], name="receipt_by_person", condition=Q(actor_user__isnull=False))]

    def __str__(self) -> str:
        verdict = "accepted" if self.accepted else f"refused ({self.refusal_code})"
        return f"{self.line}.{self.event} {self.from_state}→{self.to_state or '—'} {verdict}"


class OutboxMessage(AppendOnlyModel):
    """Written in the acceptance transaction; relayed after commit, at least once."""

    MUTABLE_FIELDS = frozenset({"published_at", "delivery_attempts", "last_error", "claimed_until"})

    topic = models.CharField(max_length=64)
    dedupe_key = models.CharField(max_length=255, unique=True)
    payload = models.JSONField()
    intent = models.ForeignKey(PaymentIntent, on_delete=models.PROTECT, related_name="outbox_messages")
    created_at = models.DateTimeField()
    published_at = models.DateTimeField(null=True, blank=True)
    delivery_attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    claimed_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["created_at"], name="agentpay_outbox_unpublished",
                                condition=Q(published_at__isnull=True))]

    def __str__(self) -> str:
        return f"{self.topic} {self.dedupe_key}"


class GatewayRequest(AppendOnlyModel):
    """Every request to /agentpay/, stored on arrival (raw body included) and answered later.

    Bad requests are kept too: the record is how support explains a refusal to an agent's owner.
    """

    MUTABLE_FIELDS = frozenset({"tenant", "route", "intent", "answer_status", "answer_problem", "answered_at",
                                "duration_ms"})

    request_id = models.UUIDField(unique=True)
    received_at = models.DateTimeField()
    method = models.CharField(max_length=16)
    path = models.TextField(help_text="NULs written as \\u0000.")
    query = models.TextField(blank=True, default="")
    headers = models.JSONField(default=dict, help_text="A subset; never the API key itself.")
    body = models.BinaryField(blank=True, default=b"")
    body_size = models.PositiveBigIntegerField(default=0)
    body_digest = models.CharField(max_length=64)
    body_truncated = models.BooleanField(default=False)
    idempotency_key = models.TextField(blank=True, default="")
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    route = models.ForeignKey(PricedRoute, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    intent = models.ForeignKey(PaymentIntent, null=True, blank=True, on_delete=models.PROTECT,
                               related_name="gateway_requests")
    answer_status = models.PositiveSmallIntegerField(null=True, blank=True)
    answer_problem = models.CharField(max_length=64, blank=True, default="")
    answered_at = models.DateTimeField(null=True, blank=True)
    duration_ms = models.PositiveIntegerField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.request_id} {self.method} {self.path[:60]} → {self.answer_status or '…'}"
