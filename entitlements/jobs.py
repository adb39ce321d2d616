"""The entitlements app's scheduled job (SPEC §10): retrying failed pushes to subscribers, and the
purge of expired API idempotency records. Registered through dunning.jobs.catalog."""

from __future__ import annotations

from dunning.jobs.framework import JobReport, due_in_order, scheduled_job
from entitlements.api.idempotency import idempotency_purge_expired
from entitlements.models import DeliveryStatus, EntitlementDelivery
from entitlements.push import entitlement_delivery_attempt


@scheduled_job("entitlement_push", "retry failed entitlement pushes to subscribers with back-off; purge expired "
                                   "idempotency records")
def entitlement_push(run: JobReport) -> None:
    due = EntitlementDelivery.objects.filter(status=DeliveryStatus.PENDING, next_attempt_at__lte=run.now)
    for pk in due_in_order(due, "next_attempt_at"):
        run.examined += 1
        run.tick()
        outcome = entitlement_delivery_attempt(delivery_pk=pk, now=run.now)
        if outcome == "DELIVERED":
            run.changed += 1
        elif outcome in ("RETRY", "GAVE_UP"):
            run.errors += 1
            run.note(f"delivery {pk}: {outcome}")
    purged = idempotency_purge_expired(now=run.now)
    if purged:
        run.note(f"purged {purged} expired idempotency records")
