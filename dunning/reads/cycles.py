"""The one read of a cycle that deciding or asking for its next edge needs."""

from __future__ import annotations

from dunning.models import DunningCycle
from dunning.policy.cache import deferred_policy


def cycle_read(cycle_pk: int) -> DunningCycle:
    """A cycle with what deciding its next step reads (invoice, policy, subscription, pending
    attempt); the policy's document stays deferred, its spec comes from the cache."""
    return (DunningCycle.objects.select_related("invoice", "policy", "subscription", "pending_attempt")
            .defer(*deferred_policy("policy")).get(pk=cycle_pk))
