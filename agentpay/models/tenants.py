"""Who pays (tenants and their API keys) and what they pay for (priced routes)."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q

from agentpay import ids
from agentpay.models.append_only import AppendOnlyModel

CURRENCY = RegexValidator(r"^[a-z]{3}$", "a lower-case ISO 4217 code, e.g. usd")


class TenantStatus(models.TextChoices):
    ACTIVE = "active", "Active"
    FROZEN = "frozen", "Frozen (every call is refused: policy_denied)"  # a frozen wallet is LedgerAccount.frozen


class Tenant(models.Model):
    tenant_id = models.CharField(max_length=40, unique=True, default=ids.new_tenant_id)
    name = models.CharField(max_length=200)
    status = models.CharField(max_length=16, choices=TenantStatus.choices, default=TenantStatus.ACTIVE)
    # The provider subscription (sub_…) whose entitlement profile says whether API calls are
    # allowed. A reference, not a foreign key: agentpay reads entitlements, never owns them.
    subscription_ref = models.CharField(max_length=255, blank=True, default="")
    # The provider customer (cus_…) whose payments top this tenant's wallet up, when a payment does
    # not name the tenant in metadata.agentpay_tenant (services/topups.py).
    provider_customer_ref = models.CharField(max_length=255, blank=True, default="", db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            # One provider customer's payments top up one tenant: a shared customer would let a
            # payment be claimed by whichever tenant asked first.
            models.UniqueConstraint(fields=["provider_customer_ref"], condition=~Q(provider_customer_ref=""),
                                    name="one_tenant_per_provider_customer"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.tenant_id})"


class TenantCustomerLink(AppendOnlyModel):
    """Every change of a tenant's provider customer: who, why, which ticket (it decides whose
    payments credit the wallet, so it is never changed without a trace)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="customer_links")
    previous_ref = models.CharField(max_length=255, blank=True, default="")
    customer_ref = models.CharField(max_length=255, blank=True, default="", help_text="Empty: unlinked.")
    actor_user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    reason = models.TextField()
    ticket = models.CharField(max_length=128)
    linked_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.tenant}: {self.previous_ref or '—'} → {self.customer_ref or '—'}"


class TenantApiKey(models.Model):
    """A key is shown once, at creation; only its SHA-256 digest is stored."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="api_keys")
    label = models.CharField(max_length=200, blank=True, default="")
    key_prefix = models.CharField(max_length=16, help_text="The first characters, to tell keys apart.")
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.key_prefix}… ({self.tenant.name})"


class HttpMethod(models.TextChoices):
    GET = "GET"
    POST = "POST"
    PUT = "PUT"
    PATCH = "PATCH"
    DELETE = "DELETE"


class PricedRoute(models.Model):
    """One upstream API an agent may call through the gateway, at a fixed price per call."""

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    upstream_base_url = models.URLField(help_text="e.g. https://api.example.com")
    upstream_path = models.CharField(max_length=500, default="/", help_text="prefix the caller's path is appended to")
    method = models.CharField(max_length=8, choices=HttpMethod.choices, default=HttpMethod.POST)
    price_minor = models.PositiveBigIntegerField(validators=[MinValueValidator(1)])
    currency = models.CharField(max_length=3, validators=[CURRENCY], default="usd")
    rails_allowed = models.JSONField(default=list, help_text='e.g. ["wallet"] or ["wallet", "onchain"]')
    connect_timeout_seconds = models.FloatField(default=3.0)
    read_timeout_seconds = models.FloatField(default=30.0)
    # The upstream's idempotent status query: GET <status_query_url>/<ful_id>.
    status_query_url = models.URLField(blank=True, default="")
    # wallet-ledger-spec §9.4: the upstream promises that its `not_found` answer fences the key
    # (a later call with it is refused), so a fenced not_found proves "not executed".
    fences_not_found = models.BooleanField(default=False)
    # The on-chain rail (issue 18): the network whose token this route takes; needed for "onchain".
    network = models.ForeignKey("agentpay.ChainNetwork", null=True, blank=True, on_delete=models.PROTECT,
                                related_name="routes")
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.CheckConstraint(condition=models.Q(price_minor__gt=0), name="route_price_positive")]

    def __str__(self) -> str:
        return f"{self.slug} ({self.price_minor} {self.currency})"
