"""Setting a tenant up: the tenant and its wallet, in one transaction.

A tenant with no wallet would answer its first call with a surprise; so the wallet is made with
the tenant (empty: money comes only from a provider payment or a staff credit). A tenant made
some other way still gets a clear answer: `policy_denied` (no_wallet), a 402 `no-wallet`.
"""

from __future__ import annotations

from django.conf import settings
from django.db import transaction

from agentpay.models import Tenant
from agentpay.services.ledger import wallet_ensure


def tenant_create(*, name: str, currency: str | None = None, subscription_ref: str = "",
                  provider_customer_ref: str = "") -> Tenant:
    """A new tenant with an empty wallet in `currency` (default AGENTPAY_DEFAULT_CURRENCY);
    `provider_customer_ref` (cus_…) is the Stripe customer whose payments top it up."""
    with transaction.atomic(durable=True):
        tenant = Tenant.objects.create(name=name, subscription_ref=subscription_ref,
                                       provider_customer_ref=provider_customer_ref)
        wallet_ensure(tenant=tenant, currency=(currency or settings.AGENTPAY_DEFAULT_CURRENCY).lower())
    return tenant
