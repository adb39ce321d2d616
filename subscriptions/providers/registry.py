"""Which provider adapter serves a provider name. Built from settings on each call (cheaply
cached per configuration), so tests that point STRIPE_API_BASE at a simulator just work."""

from __future__ import annotations

from functools import lru_cache

from django.conf import settings

from subscriptions.providers.base import PaymentProvider
from subscriptions.providers.stripe_adapter import StripeProvider


@lru_cache(maxsize=8)
def _stripe(api_key: str, api_base: str, secrets: tuple[str, ...], account: str, timeout: float,
            api_version: str) -> StripeProvider:
    return StripeProvider(api_key=api_key, api_base=api_base, webhook_secrets=secrets, account=account,
                          timeout=timeout, api_version=api_version or None)


def get_provider(name: str = "stripe") -> PaymentProvider:
    if name != "stripe":
        raise LookupError(f"no adapter for provider {name!r}")
    return _stripe(settings.STRIPE_API_KEY, settings.STRIPE_API_BASE, tuple(settings.STRIPE_WEBHOOK_SECRETS),
                   settings.STRIPE_ACCOUNT, settings.STRIPE_TIMEOUT_SECONDS, settings.STRIPE_API_VERSION)
