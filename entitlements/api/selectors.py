"""Loading by id for the API, within what the caller may see (object-level permission: outside
a token's restriction is the same 404 as missing)."""

from __future__ import annotations

import re
import uuid

from django.http import Http404
from rest_framework.request import Request

from dunning.acceptance.aggregate import is_blocking
from dunning.acceptance.settlement import cycle_view
from dunning.models import DunningCycle
from dunning.states import DELINQUENT_STATES
from dunning.storable import storable_text
from entitlements.api.auth import restrict_subscriptions
from entitlements.models import EntitlementSnapshot
from subscriptions.models import Subscription

_PK = re.compile(r"^[0-9]{1,18}$")


def subscription_for_request(request: Request, ref: str) -> Subscription:
    """`ref` is the local id or the provider's subscription id (sub_…). A ref no id column can hold
    (a NUL, longer than the column) names no subscription: 404 without asking the database."""
    if not storable_text(ref, Subscription._meta.get_field("provider_subscription_id").max_length):
        raise Http404("no such subscription")
    queryset = restrict_subscriptions(Subscription.objects.select_related("policy"), request)
    lookup = {"pk": int(ref)} if _PK.match(ref) else {"provider_subscription_id": ref}
    found = list(queryset.filter(**lookup)[:2])
    if len(found) != 1:
        raise Http404("no such subscription")
    return found[0]


def cycle_for_request(request: Request, ref: str) -> DunningCycle:
    """`ref` is the cycle's uuid (cycle_id) or its local id."""
    queryset = restrict_subscriptions(
        DunningCycle.objects.select_related("subscription", "invoice", "policy", "pending_attempt", "unknown_owner"),
        request, prefix="subscription__",
    )
    if _PK.match(ref):
        lookup: dict[str, object] = {"pk": int(ref)}
    else:
        try:
            lookup = {"cycle_id": uuid.UUID(ref)}
        except ValueError:
            raise Http404("no such cycle") from None
    cycle = queryset.filter(**lookup).first()
    if cycle is None:
        raise Http404("no such cycle")
    return cycle


def subscription_blocking_cycles(subscription: Subscription) -> list[DunningCycle]:
    cycles = (DunningCycle.objects.filter(subscription=subscription, state__in=DELINQUENT_STATES)
              .select_related("subscription", "invoice", "policy", "unknown_owner").order_by("opened_at", "pk"))
    return [c for c in cycles if is_blocking(cycle_view(c))]


def subscription_current_snapshot(subscription: Subscription) -> EntitlementSnapshot | None:
    return (EntitlementSnapshot.objects.filter(subscription=subscription,
                                               generation__lte=subscription.entitlement_generation)
            .order_by("-generation").first())
