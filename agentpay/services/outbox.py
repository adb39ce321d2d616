"""The outbox relay: AgentPay's outbox rows, published after their acceptance committed.

The acceptance service writes one row per accepted change, in its own transaction; the relay
only ever reads committed rows, so nothing is published for a change that rolled back. A row
is claimed by compare-and-set (`claimed_until`), handed to every consumer of its topic, and
marked published; a consumer that fails leaves the row unpublished with its error, for the next
run. Delivery is at least once, so consumers are idempotent: they key on `dedupe_key`
(`pi_…:<generation>`).

What consumes the rows: the structured log line below (one JSON line per change, with the
intent, its generation, display status and the `request_id` that caused it), which is what ops
tooling and the request-log search read; and the signed webhook to the intent's tenant
(`services/webhooks.py`), deduplicated by a delivery row per (message, tenant). Every consumer
of a row runs even when another fails; the row is published when all of them succeeded. Once
a consumer fails for a receiver (a tenant's endpoint) in a run, that receiver's later rows wait
for the next run unsent: a dead endpoint costs one timeout per run, and no other tenant waits.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import F, Q

from agentpay.models import OutboxMessage
from agentpay.services.acceptance import OUTBOX_TOPIC
from agentpay.services.webhooks import webhook_deliver

events_log = logging.getLogger("agentpay.events")
Consumer = Callable[[OutboxMessage], None]
CLAIM_SECONDS = 60


def log_intent_changed(message: OutboxMessage) -> None:
    """One structured line per change (idempotent: a repeat carries the same dedupe_key)."""
    p = message.payload
    events_log.info(json.dumps({
        "event": message.topic, "dedupe_key": message.dedupe_key, "request_id": p.get("request_id"),
        "intent_id": p.get("intent_id"), "generation": p.get("generation"), "rail": p.get("rail"),
        "intent": p.get("intent"), "settlement": p.get("settlement"), "fulfillment": p.get("fulfillment"),
        "display_status": p.get("display_status"), "events": p.get("events"), "actor": p.get("actor")},
        sort_keys=True))


CONSUMERS: dict[str, list[Consumer]] = {OUTBOX_TOPIC: [log_intent_changed, webhook_deliver]}
# What a consumer's failure is about (its receiver), so the relay stops trying it for the run.
DEFER_KEYS: dict[Consumer, Callable[[OutboxMessage], str]] = {
    webhook_deliver: lambda message: f"tenant {message.intent.tenant_id}"}


@dataclass
class Relayed:
    published: int = 0
    failed: int = 0
    skipped: int = 0  # claimed by another relay meanwhile


def _claimable(now: datetime) -> Q:
    return Q(published_at__isnull=True) & (Q(claimed_until__isnull=True) | Q(claimed_until__lte=now))


def outbox_relay(*, now: datetime, batch: int = 200) -> Relayed:
    """Publish up to `batch` committed, unpublished rows, oldest first."""
    result = Relayed()
    pks = list(OutboxMessage.objects.filter(_claimable(now)).order_by("created_at", "pk")
               .values_list("pk", flat=True)[:batch])
    # A consumer that failed for one key (a tenant's dead endpoint) is not tried again for that
    # key in this run: one unreachable receiver costs one timeout per run, not one per row, and
    # its later rows keep their order behind the failed one.
    failed_keys: set[str] = set()
    for pk in pks:
        claimed = OutboxMessage.objects.filter(_claimable(now), pk=pk).update(
            claimed_until=now + timedelta(seconds=CLAIM_SECONDS), delivery_attempts=F("delivery_attempts") + 1)
        if claimed != 1:
            result.skipped += 1
            continue
        message = OutboxMessage.objects.select_related("intent").get(pk=pk)
        errors = []
        for consumer in CONSUMERS.get(message.topic, []):
            name = getattr(consumer, "__name__", str(consumer))
            key_of = DEFER_KEYS.get(consumer)
            key = f"{name}:{key_of(message)}" if key_of else ""
            if key in failed_keys:
                errors.append(f"{name}: deferred: it failed for {key_of(message)} earlier in this run")
                continue
            try:
                consumer(message)
            except Exception as exc:  # one consumer's failure neither stops the others nor other rows
                errors.append(f"{name}: {type(exc).__name__}: {exc}")
                if key:
                    failed_keys.add(key)
        if errors:
            OutboxMessage.objects.filter(pk=pk).update(claimed_until=None, last_error="\n".join(errors)[:2000])
            result.failed += 1
            continue
        OutboxMessage.objects.filter(pk=pk, published_at__isnull=True).update(published_at=now, claimed_until=None,
                                                                              last_error="")
        result.published += 1
    return result
