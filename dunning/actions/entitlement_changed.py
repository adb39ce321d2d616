"""Consumers of `entitlement.changed` outbox messages.

Runtime services read the snapshot table (and the API). The message is also pushed, signed, to
every active `EntitlementSubscriber` of the subscription's cohort: one delivery row per
(message, subscriber), each tried once here and retried by the `entitlement_push` job, so the
relay can mark the message published whatever a subscriber answers (see entitlements.push).
"""

from __future__ import annotations

from datetime import datetime

from dunning.models import OutboxMessage
from entitlements.push import message_deliveries_attempt


def entitlement_changed(message: OutboxMessage, *, now: datetime) -> None:
    message_deliveries_attempt(message=message, now=now)
