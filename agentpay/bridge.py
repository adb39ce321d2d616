"""Everything AgentPay takes from the dunning/subscriptions/entitlements side, in one place.

Seed 003 keeps usage billing apart from subscription debt: AgentPay never writes a dunning
cycle. It reads three things: the trusted clock, whether a tenant's linked subscription may
use API tokens (its entitlement profile), and provider objects (a top-up's PaymentIntent) through
the subscriptions side's Stripe adapter (the official SDK, `STRIPE_API_BASE` and friends). Those
modules are about to move; only this file changes when they do.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dunning.acceptance.row_inserts import insert_fields, insert_params, mark_saved, unsaved_row  # noqa: F401
from dunning.clock import now_is_not_ahead as _now_is_not_ahead
from dunning.clock import trusted_now as _trusted_now
from dunning.evidence.connection_health import health_check_without_round_trip  # noqa: F401
from dunning.privacy import desensitise_body as _desensitise_body
from entitlements.profiles import get_profile
from subscriptions.models import Subscription
from subscriptions.providers.base import ProviderError, ProviderIndeterminate, ProviderNotFound
from subscriptions.providers.registry import get_provider


def trusted_now() -> datetime:
    return _trusted_now()


def desensitised_body(body: bytes) -> bytes:
    """A request body as it may be stored: emails, names, phones, addresses and card details
    masked or keyed-hashed (dunning.privacy, docs/privacy.md)."""
    return _desensitise_body(body)


def now_is_not_ahead(now: datetime) -> tuple[bool, datetime]:
    """Whether a job's `now` is at or before the trusted (database) clock; the clock read."""
    return _now_is_not_ahead(now, "DATABASE")


@dataclass(frozen=True)
class ApiAccess:
    allowed: bool
    profile: str = ""
    detail: str = ""


def api_access_for(subscription_ref: str, *, method: str) -> ApiAccess:
    """May a tenant linked to `subscription_ref` make an API call with `method`?

    The entitlement profile's `api_tokens` capability decides: "none" refuses every call,
    "read_only" refuses everything but GET. A tenant linked to no subscription is not limited
    by one (its wallet balance still is). A reference to a subscription we do not know refuses:
    a typo must not open access.
    """
    if not subscription_ref:
        return ApiAccess(True)
    subscription = (Subscription.objects.filter(provider_subscription_id=subscription_ref)
                    .only("entitlement_profile").first())
    if subscription is None:
        return ApiAccess(False, "", f"the linked subscription {subscription_ref} is not known")
    profile = get_profile(subscription.entitlement_profile)
    if profile.api_tokens == "none":
        return ApiAccess(False, profile.name, f"the subscription's access ({profile.name}) allows no API calls")
    if profile.api_tokens == "read_only" and method != "GET":
        return ApiAccess(False, profile.name, f"the subscription's access ({profile.name}) allows read-only calls")
    return ApiAccess(True, profile.name)


class ProviderUnavailable(Exception):
    """The provider did not answer (timeout, connection error, 5xx, rate limit): nothing is known."""


class ProviderNoSuchObject(Exception):
    """The provider says there is no such object."""


class ProviderRefusedRequest(Exception):
    """The provider answered, but refused the request (a 4xx other than not found)."""


def provider_payment_fetch(payment_id: str) -> dict[str, Any]:
    """A PaymentIntent (`pi_…`) or charge (`ch_…`, `py_…`) as Stripe returns it now, fetched with the
    official SDK through the subscriptions adapter (no retries, `STRIPE_TIMEOUT_SECONDS`)."""
    try:
        return dict(get_provider().fetch_payment(payment_id).raw)
    except ProviderIndeterminate as exc:
        raise ProviderUnavailable(str(exc)) from exc
    except ProviderNotFound as exc:
        raise ProviderNoSuchObject(str(exc)) from exc
    except ProviderError as exc:
        raise ProviderRefusedRequest(str(exc)) from exc
