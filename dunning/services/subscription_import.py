"""Importing a provider subscription seen for the first time, and keeping its mirror current."""

from __future__ import annotations

from datetime import datetime

from dunning.services.opening import subscription_register
from dunning.services.results import Cause
from subscriptions.models import Customer, Subscription
from subscriptions.providers.base import ProviderSubscription


def subscription_import(remote: ProviderSubscription, *, cause: Cause, now: datetime) -> tuple[Subscription, bool]:
    """Return (subscription, created). A new one is bound to its policy and gets generation 1."""
    existing = Subscription.objects.filter(provider="stripe", provider_subscription_id=remote.id).first()
    if existing is not None:
        if existing.provider_status != remote.status:
            existing.provider_status = remote.status
            existing.save(update_fields=["provider_status", "updated_at"])
        return existing, False
    customer, _ = Customer.objects.get_or_create(
        provider="stripe", provider_customer_id=remote.customer_id,
        defaults={"email": remote.customer_email or f"{remote.customer_id}@unknown.invalid"},
    )
    sub = subscription_register(
        customer=customer, provider_account=remote.account, provider_subscription_id=remote.id,
        price_id=remote.price_ids[0] if remote.price_ids else "", cause=cause, now=now,
        billing_interval="year" if remote.interval == "year" else "month", provider_status=remote.status,
    )
    return sub, True
