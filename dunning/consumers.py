"""Consumers of `entitlement.changed` outbox messages.

Runtime services read the snapshot table (and the API). Pushing to subscriber URLs is added
with the REST API; until one is configured there is nothing to deliver, and the message is
published so it does not sit in the relay's queue.
"""

from __future__ import annotations

from datetime import datetime

from dunning.models import OutboxMessage


def entitlement_changed(message: OutboxMessage, *, now: datetime) -> None:
    return None
