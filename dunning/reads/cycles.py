"""The one read of a cycle that deciding or asking for its next edge needs."""

from __future__ import annotations

from django.db.models import QuerySet

from dunning.models import DunningCycle
from dunning.policy.cache import deferred_policy


def _for_next_step() -> QuerySet[DunningCycle]:
    return (DunningCycle.objects.select_related("invoice", "policy", "subscription", "pending_attempt")
            .defer(*deferred_policy("policy")))


def cycle_read(cycle_pk: int) -> DunningCycle:
    """A cycle with what deciding its next step reads (invoice, policy, subscription, pending
    attempt); the policy's document stays deferred, its spec comes from the cache."""
    return _for_next_step().get(pk=cycle_pk)


def cycle_read_for_invoice(provider: str, provider_invoice_id: str) -> DunningCycle | None:
    """`cycle_read` of the cycle of one provider invoice, or None: an event's processing finds
    its cycle and plans its first step from the same read."""
    return _for_next_step().filter(invoice__provider=provider, invoice__provider_invoice_id=provider_invoice_id).first()
