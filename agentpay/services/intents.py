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
from agentpay.services.acceptance import accepted_receipt, outbox_message
from agentpay.services.results import Cause, Step
from agentpay.services.x402_effects import challenge_row, network_refusal
from agentpay.states import FULFILLMENT, INITIAL, INTENT, ONCHAIN, SETTLEMENT, TRANSITIONS, Lines, step_verdict


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
                now: datetime, challenge: str | None = None, lease: bool = True) -> Opened:
    """Insert the intent for (tenant, key), or find the one that holds the key already.

    `challenge` (the resource URL the 402 names): an on-chain intent the caller found no policy
    refusal for is opened *challenged* in the same transaction, exactly as the `challenge_issued`
    acceptance would leave it: its PaymentChallenge, the `opened` (generation 0) and
    `challenge_issued` (generation 1) receipts and generation 1's outbox row. The step is checked
    against the tables like any other; a route whose network cannot take the chain is opened
    `created` and left to the acceptance, which refuses it. `lease=False`: no request goes on
    with the intent (a 402 is the whole answer), so no lease is taken and none is released.
    """
    cause = Cause.request(request_id, tenant.tenant_id)
    intent = PaymentIntent(
        tenant=tenant, idempotency_key=idempotency_key, request_digest=digest, rail=rail, route=route,
        amount=route.price_minor, currency=route.currency, created_at=now, state_changed_at=now,
        first_request_id=request_id, processing_until=now + lease_for(route) if lease else None,
        forward_path=forward_path, forward_query=forward_query, forward_content_type=content_type, forward_body=body)
    lines = Lines(rail=rail, intent=INITIAL[INTENT], settlement=INITIAL[SETTLEMENT], fulfillment=INITIAL[FULFILLMENT])
    issued = challenge is not None and rail == ONCHAIN and not network_refusal(intent, route.network)
    if issued:
        step = Step(INTENT, "challenge_issued", {"resource": challenge})
        verdict = step_verdict(lines, step.line, step.event)
        if not verdict.allowed:  # the tables say a fresh on-chain intent can always be challenged
            raise AssertionError(f"challenge_issued refused on open: {verdict.code} {verdict.detail}")
        lines = lines.moved(INTENT, TRANSITIONS[INTENT][(INITIAL[INTENT], step.event)])
        intent.state, intent.generation, intent.challenged_at = lines.intent, 1, now
    try:
        with transaction.atomic(durable=True):
            intent.save(force_insert=True)
            Settlement.objects.create(intent=intent, rail=rail, created_at=now, state_changed_at=now)
            Fulfillment.objects.create(intent=intent, state_changed_at=now)
            opened = Step(INTENT, "opened", {"route": route.slug, "amount": route.price_minor,
                                             "currency": route.currency, "rail": rail})
            receipts = [accepted_receipt(intent, opened, "", INITIAL[INTENT], 0, cause, now)]
            if issued:
                challenge_row(intent, route.network, challenge, now).save(force_insert=True)
                receipts.append(accepted_receipt(intent, step, INITIAL[INTENT], lines.intent, 1, cause, now))
            IntentReceipt.objects.bulk_create(receipts)  # one INSERT
            if issued:
                outbox_message(intent, lines, [step], cause, now).save(force_insert=True)
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
