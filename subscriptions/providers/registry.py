"""Which provider adapter serves a provider name. Built from settings on each call (cheaply
cached per configuration), so tests that point STRIPE_API_BASE or ALIPAY_GATEWAY_URL at a
simulator just work."""

from __future__ import annotations

import json
import threading
from functools import lru_cache
from pathlib import Path

from django.conf import settings

from subscriptions.providers.alipay.adapter import AlipayProvider
from subscriptions.providers.alipay.gateway import AlipayGateway
from subscriptions.providers.base import PaymentProvider
from subscriptions.providers.stripe_adapter import StripeProvider

# Every adapter, by the name stored on customers, subscriptions, invoices and events (and used in
# the webhook route /webhooks/<name>/).
PROVIDER_NAMES = ("stripe", "alipay")


@lru_cache(maxsize=8)
def _stripe(api_key: str, api_base: str, secrets: tuple[str, ...], account: str, timeout: float,
            api_version: str, rate_limit_retry_seconds: float, max_requests_per_second: float) -> StripeProvider:
    return StripeProvider(api_key=api_key, api_base=api_base, webhook_secrets=secrets, account=account,
                          timeout=timeout, api_version=api_version or None,
                          rate_limit_retry_seconds=rate_limit_retry_seconds,
                          max_requests_per_second=max_requests_per_second)


@lru_cache(maxsize=8)
def _alipay(app_id: str, gateway_url: str, private_key: str, public_key: str, notify_url: str, timeout: float,
            plans: str) -> AlipayProvider:
    gateway = None
    if app_id and private_key and public_key:
        gateway = AlipayGateway(app_id, _pem(private_key), _pem(public_key), gateway_url, notify_url, timeout)
    return AlipayProvider(gateway=gateway, app_id=app_id, plans=json.loads(plans))


def _pem(value: str) -> str:
    """A key given as PEM text, or as the path of a PEM file."""
    if "-----BEGIN" in value:
        return value
    return Path(value).read_text()


def alipay_notify_url() -> str:
    return settings.ALIPAY_NOTIFY_URL or f"{str(getattr(settings, 'SITE_URL', '')).rstrip('/')}/webhooks/alipay/"


# lru_cache does not hold a lock while it builds: threads asking at once (a sweep's provider-I/O
# threads on their first row) would each build an adapter, each with its own pacer and full burst.
_BUILDING = threading.Lock()


def get_provider(name: str = "stripe") -> PaymentProvider:
    if name == "stripe":
        with _BUILDING:
            return _stripe(settings.STRIPE_API_KEY, settings.STRIPE_API_BASE, tuple(settings.STRIPE_WEBHOOK_SECRETS),
                           settings.STRIPE_ACCOUNT, settings.STRIPE_TIMEOUT_SECONDS, settings.STRIPE_API_VERSION,
                           float(getattr(settings, "STRIPE_RATE_LIMIT_RETRY_SECONDS", 5.0)),
                           float(getattr(settings, "STRIPE_MAX_REQUESTS_PER_SECOND", 0.0)))
    if name == "alipay":
        return _alipay(settings.ALIPAY_APP_ID, settings.ALIPAY_GATEWAY_URL, settings.ALIPAY_APP_PRIVATE_KEY,
                       settings.ALIPAY_PUBLIC_KEY, alipay_notify_url(), settings.ALIPAY_TIMEOUT_SECONDS,
                       json.dumps(settings.ALIPAY_PLANS, sort_keys=True))
    raise LookupError(f"no adapter for provider {name!r}")


def all_providers() -> list[PaymentProvider]:
    return [get_provider(name) for name in PROVIDER_NAMES]
