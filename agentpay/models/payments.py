"""The three state lines of one payment (seed 004 §4): intent, settlement, fulfillment.

Only `agentpay.services.acceptance` changes their states; every change bumps the intent's
`generation` by compare-and-set, so a stale writer is refused, never applied.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from agentpay import ids
from agentpay.models.ledger import Transfer
from agentpay.models.tenants import CURRENCY, PricedRoute, Tenant
from agentpay.states import FULFILLMENT, INTENT, ONCHAIN, SETTLEMENT, WALLET, states_of


def _choices(line: str) -> list[tuple[str, str]]:
    return [(s, s) for s in states_of(line)]


RAIL_CHOICES = [(WALLET, "Wallet"), (ONCHAIN, "On-chain (x402)")]


class PaymentIntent(models.Model):
    intent_id = models.CharField(max_length=40, unique=True, default=ids.new_intent_id)
    # Indexed by one_intent_per_tenant_key (tenant, idempotency_key), not on its own.
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="intents", db_index=False)
    idempotency_key = models.CharField(max_length=255)
    request_digest = models.CharField(max_length=64, help_text="SHA-256 of method, route, path, query and body.")
    rail = models.CharField(max_length=8, choices=RAIL_CHOICES)
    route = models.ForeignKey(PricedRoute, on_delete=models.PROTECT, related_name="intents")
    amount = models.PositiveBigIntegerField()
    currency = models.CharField(max_length=3, validators=[CURRENCY])
    state = models.CharField(max_length=16, choices=_choices(INTENT), default="created")
    generation = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField()
    state_changed_at = models.DateTimeField()
    first_request_id = models.UUIDField()
    # While one request drives this intent (hold, dispatch, upstream call), others with the same
    # key get 409; a lease, so a crashed request does not hold the key forever.
    processing_until = models.DateTimeField(null=True, blank=True)
    challenged_at = models.DateTimeField(null=True, blank=True)
    # What the gateway forwards, kept so a resumed request sends exactly the same call.
    forward_path = models.CharField(max_length=2000, blank=True, default="")
    forward_query = models.TextField(blank=True, default="")
    forward_content_type = models.CharField(max_length=200, blank=True, default="")
    forward_body = models.BinaryField(blank=True, default=b"")
    needs_review_at = models.DateTimeField(null=True, blank=True)
    review_owner = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT,
                                     related_name="agentpay_reviews", db_index=False)
    review_owner_assigned_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # seed §2: one tenant key is exactly one intent, for ever (not a cache that expires).
            models.UniqueConstraint(fields=["tenant", "idempotency_key"], name="one_intent_per_tenant_key"),
            models.CheckConstraint(condition=Q(amount__gt=0), name="intent_amount_positive"),
        ]
        indexes = [
            models.Index(fields=["state", "needs_review_at"], name="intent_review_queue",
                         condition=Q(state="needs_review")),
            models.Index(fields=["challenged_at"], name="intent_challenged", condition=Q(state="challenged")),
            models.Index(fields=["review_owner"], name="intent_by_review_owner",
                         condition=Q(review_owner__isnull=False)),
        ]

    def __str__(self) -> str:
        return f"{self.intent_id} {self.state}"


class Settlement(models.Model):
    settlement_id = models.CharField(max_length=40, unique=True, default=ids.new_settlement_id)
    intent = models.ForeignKey(PaymentIntent, on_delete=models.PROTECT, related_name="settlements")
    rail = models.CharField(max_length=8, choices=RAIL_CHOICES)
    state = models.CharField(max_length=16, choices=_choices(SETTLEMENT), default="not_started")
    hold = models.OneToOneField(Transfer, null=True, blank=True, on_delete=models.PROTECT, related_name="+",
                                help_text="Wallet rail: the pending transfer (hld_…).")
    created_at = models.DateTimeField()
    state_changed_at = models.DateTimeField()
    # On-chain rail: its transaction is `chain_tx` (agentpay.models.chain.ChainTransaction).

    class Meta:
        constraints = [
            # seed §2: at most one live settlement per intent at any moment.
            models.UniqueConstraint(fields=["intent"], condition=~Q(state__in=["failed", "released"]),
                                    name="one_live_settlement_per_intent"),
        ]

    def __str__(self) -> str:
        return f"{self.settlement_id} {self.rail} {self.state}"


class Fulfillment(models.Model):
    fulfillment_id = models.CharField(max_length=40, unique=True, default=ids.new_fulfillment_id)
    intent = models.OneToOneField(PaymentIntent, on_delete=models.PROTECT, related_name="fulfillment")
    state = models.CharField(max_length=16, choices=_choices(FULFILLMENT), default="not_started")
    upstream_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    upstream_error = models.TextField(blank=True, default="")
    dispatched_at = models.DateTimeField(null=True, blank=True)
    unknown_since = models.DateTimeField(null=True, blank=True)
    recovery_deadline = models.DateTimeField(null=True, blank=True)
    status_queries = models.PositiveIntegerField(default=0)
    last_status_query_at = models.DateTimeField(null=True, blank=True)
    last_status_query_answer = models.CharField(max_length=64, blank=True, default="")
    state_changed_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["recovery_deadline"], name="fulfillment_unknown",
                                condition=Q(state="unknown"))]

    def __str__(self) -> str:
        return f"{self.fulfillment_id} {self.state}"


class ReviewQueueIntent(PaymentIntent):
    """The admin's "Needs review" queue: intents in needs_review (a proxy: the same rows)."""

    class Meta:
        proxy = True
        verbose_name = "needs-review intent"
        verbose_name_plural = "needs review (queue)"
