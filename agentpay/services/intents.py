"""Opening an intent under a tenant's idempotency key, and the processing lease.

The key's mapping to one intent is the UNIQUE(tenant, idempotency_key) constraint on the intent
row itself: the first request inserts it (with its settlement and fulfillment, in one
transaction), every other request with the same key finds it. While a request drives the
intent it holds a lease (`processing_until`); a second request meanwhile is "in flight" (409).
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q

from agentpay.models import Fulfillment, IntentReceipt, PaymentIntent, PricedRoute, Settlement, Tenant
from agentpay.services.results import Cause


def request_digest(*, method: str, route_slug: str, path: str, query: str, content_type: str, body: bytes) -> str:
    """What "the same request" means for a key: method, route, path, query, content type, body."""
    h = hashlib.sha256()
    for part in (method, route_slug, path, query, content_type):
        h.update(part.encode("utf-8", "surrogatepass") + b"\x1f")
    h.update(body)
    return h.hexdigest()


@dataclass(frozen=True)
class Opened:
    intent: PaymentIntent
    created: bool


def lease_for(route: PricedRoute) -> timedelta:
    return timedelta(seconds=route.connect_timeout_seconds + route.read_timeout_seconds
                     + settings.AGENTPAY_PROCESSING_LEASE_MARGIN_SECONDS)


def intent_open(*, tenant: Tenant, route: PricedRoute, rail: str, idempotency_key: str, digest: str,
                forward_path: str, forward_query: str, content_type: str, body: bytes, request_id: uuid.UUID,
                now: datetime) -> Opened:
    """Insert the intent for (tenant, key), or find the one that holds the key already."""
    try:
        with transaction.atomic(durable=True):
            intent = PaymentIntent.objects.create(
                tenant=tenant, idempotency_key=idempotency_key, request_digest=digest, rail=rail, route=route,
                amount=route.price_minor, currency=route.currency, created_at=now, state_changed_at=now,
                first_request_id=request_id, processing_until=now + lease_for(route), forward_path=forward_path,
                forward_query=forward_query, forward_content_type=content_type, forward_body=body)
            Settlement.objects.create(intent=intent, rail=rail, created_at=now, state_changed_at=now)
            Fulfillment.objects.create(intent=intent, state_changed_at=now)
            cause = Cause.request(request_id, tenant.tenant_id)
            IntentReceipt.objects.create(
                intent=intent, line="intent", event="opened", accepted=True, from_state="", to_state="created",
                generation=0, data={"route": route.slug, "amount": route.price_minor, "currency": route.currency,
                                    "rail": rail},
                cause_kind=cause.kind, actor=cause.actor, request_id=request_id, trusted_time=now)
        return Opened(intent, True)
    except IntegrityError:
        # The key is taken (perhaps by a request that committed while we waited on the index).
        existing = PaymentIntent.objects.filter(tenant=tenant, idempotency_key=idempotency_key).first()
        if existing is None:
            raise
        return Opened(existing, False)


def intent_claim_lease(*, intent: PaymentIntent, now: datetime) -> bool:
    """Take the processing lease of an intent no live request holds (a crashed one's lapsed)."""
    claimed = (PaymentIntent.objects.filter(pk=intent.pk)
               .filter(Q(processing_until__isnull=True) | Q(processing_until__lte=now))
               .update(processing_until=now + lease_for(intent.route)))
    return claimed == 1


def intent_release_lease(*, intent: PaymentIntent) -> None:
    PaymentIntent.objects.filter(pk=intent.pk).update(processing_until=None)
