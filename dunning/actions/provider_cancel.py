"""Carrying a dunning cancellation to the provider (SPEC §7): the consumer of
`provider.cancel_subscription` outbox messages, which the `cancel` edge writes with its receipt.

The provider is asked once per subscription under one idempotency key; what it answers is
stored as a receipt and applied to the contract line through the subscription's acceptance,
which records the confirmation. No definite answer (timeout, 5xx) raises, so the outbox relay
tries again with its back-off; a cancellation still unconfirmed after an hour raises an alert
(`dunning.jobs.alerts`). Until the provider confirms, the subscription shows "cancellation
requested".
"""

from __future__ import annotations

from datetime import datetime

from dunning.acceptance.inputs import Cause
from dunning.clock import trusted_now
from dunning.evidence.subscription_import import subscription_import
from dunning.models import OutboxMessage
from subscriptions.models import Subscription
from subscriptions.providers.registry import get_provider


class CancellationNotConfirmed(Exception):
    """The provider answered, but its subscription is not canceled (the relay tries again)."""


def provider_cancel_deliver(message: OutboxMessage, *, now: datetime) -> None:
    payload = message.payload
    sub = Subscription.objects.get(pk=payload["subscription"])
    if sub.provider_cancel_confirmed_at is not None:
        return  # confirmed already (an earlier delivery, or the provider's own webhook)
    remote = get_provider(sub.provider).cancel_subscription(sub.provider_subscription_id,
                                                            idempotency_key=payload["idempotency_key"])
    cause = Cause(kind="SYSTEM", ref=f"outbox:{message.pk}", actor="outbox:provider.cancel_subscription")
    subscription_import(remote, cause=cause, now=trusted_now(), fetched_at=trusted_now())
    if remote.status != "canceled":
        raise CancellationNotConfirmed(f"provider answered with status {remote.status} for "
                                       f"{sub.provider_subscription_id}")


def cancellation_state(sub: Subscription) -> str:
    """'' | 'requested' | 'confirmed', for pages and the API."""
    if sub.provider_cancel_confirmed_at is not None:
        return "confirmed"
    return "requested" if sub.provider_cancel_requested_at is not None else ""
