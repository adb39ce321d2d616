"""Messages (SPEC §10): the outbox relay and grace reminders.

The relay claims unpublished outbox rows with a lease (FOR UPDATE SKIP LOCKED, so several
workers share the work), hands each to its topic's consumer and marks it published. Delivery
is at least once; consumers are idempotent on the message id. A failure keeps the row for a
later run with a growing back-off.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Max, Q

from dunning.actions import entitlement_changed as consumers
from dunning.actions.alert_delivery import alert_message_deliver
from dunning.actions.notifications import notification_deliver
from dunning.actions.provider_cancel import provider_cancel_deliver
from dunning.claims import claim
from dunning.jobs.framework import JobReport, ahead_of_the_clock, due_in_order, scheduled_job, worker_name
from dunning.models import ALERT_RAISED_TOPIC, ENTITLEMENT_CHANGED_TOPIC, DunningCycle, DunningPolicy, OutboxMessage
from dunning.policy.cache import policy_spec
from dunning.policy.rollout import sends_notifications
from dunning.states import GRACE_PROFILE_STATES

LEASE = timedelta(seconds=60)
BATCH = 100
MAX_PER_RUN = 10_000


def _entitlement_changed(message: OutboxMessage, *, now: datetime) -> None:
    """Pushes to subscriber URLs are configured in the API layer; without subscribers the
    snapshot table is the record runtime services read."""
    consumers.entitlement_changed(message, now=now)


CONSUMERS: dict[str, Callable[..., object]] = {
    "notification.requested": notification_deliver,
    "provider.cancel_subscription": provider_cancel_deliver,
    ENTITLEMENT_CHANGED_TOPIC: _entitlement_changed,
    ALERT_RAISED_TOPIC: alert_message_deliver,  # when the after-commit hand-off to the task was lost
}


def _claim_batch(now: datetime) -> list[int]:
    with transaction.atomic():
        free = (OutboxMessage.objects.select_for_update(skip_locked=True)
                .filter(published_at__isnull=True).filter(Q(claimed_until__isnull=True) | Q(claimed_until__lte=now))
                .order_by("created_at", "pk"))
        ids = list(free.values_list("pk", flat=True)[:BATCH])
        OutboxMessage.objects.filter(pk__in=ids).update(claimed_until=now + LEASE, claimed_by=worker_name())
    return ids


def backoff(attempts: int) -> timedelta:
    return timedelta(seconds=min(30 * 2 ** max(attempts - 1, 0), 3600))


@scheduled_job("outbox_relay", "publish outbox messages after commit to their consumers (at least once)")
def outbox_relay(run: JobReport) -> None:
    while run.examined < MAX_PER_RUN:
        ids = _claim_batch(run.now)
        if not ids:
            return
        for message in OutboxMessage.objects.filter(pk__in=ids).order_by("created_at", "pk"):
            run.examined += 1
            run.tick()
            _relay_one(run, message)


def _relay_one(run: JobReport, message: OutboxMessage) -> None:
    consumer = CONSUMERS.get(message.topic)
    message.delivery_attempts += 1
    try:
        if consumer is None:
            raise LookupError(f"no consumer for topic {message.topic!r}")
        consumer(message, now=run.now)
    except Exception as exc:
        run.errors += 1
        run.note(f"outbox {message.pk} ({message.topic}): {exc}")
        message.last_error = f"{type(exc).__name__}: {exc}"[:2000]
        message.claimed_until = run.now + backoff(message.delivery_attempts)
        message.save(update_fields=["delivery_attempts", "last_error", "claimed_until"])
        return
    message.published_at = run.now
    message.last_error = ""
    message.save(update_fields=["published_at", "delivery_attempts", "last_error"])
    run.changed += 1


# --- reminders ------------------------------------------------------------------------------------

def _longest_reminder_offset() -> timedelta | None:
    offsets = [o for p in DunningPolicy.objects.all() for o in policy_spec(p).reminders_before_grace_end]
    return max(offsets) if offsets else None


@scheduled_job("reminders", "grace reminders from the policy's schedule: before grace ends, never after a "
                            "recovery, the latest due one only after an outage")
def reminders(run: JobReport) -> None:
    if ahead_of_the_clock(run):
        return
    longest = _longest_reminder_offset()
    if longest is None:
        return
    in_grace = DunningCycle.objects.filter(state__in=GRACE_PROFILE_STATES, grace_expires_at__gt=run.now,
                                           grace_expires_at__lte=run.now + longest)
    for pk in due_in_order(in_grace, "grace_expires_at"):
        run.examined += 1
        run.tick()
        with claim("reminder", pk) as got:
            if got:
                _remind(run, pk)


def due_reminder_slot(offsets: tuple[timedelta, ...], grace_expires_at: datetime, now: datetime) -> int | None:
    """The latest reminder whose send time has come, counting slots from the earliest
    (largest offset). After an outage only this one is sent: the earlier ones are stale."""
    ordered = sorted(offsets, reverse=True)
    due = [i for i, offset in enumerate(ordered) if grace_expires_at - offset <= now < grace_expires_at]
    return max(due) if due else None


def reminder_key(cycle: DunningCycle, slot: int) -> str:
    return f"reminder:{cycle.cycle_id}:{cycle.grace_expires_at.isoformat()}:{slot}"


def _remind(run: JobReport, pk: int) -> None:
    with transaction.atomic():
        cycle = (DunningCycle.objects.select_for_update(of=("self",)).select_related("subscription", "policy")
                 .get(pk=pk))
        if cycle.state not in GRACE_PROFILE_STATES or cycle.grace_expires_at is None:
            return
        spec = policy_spec(cycle.policy)
        sub = cycle.subscription
        if not sends_notifications(spec, subscription_key=sub.provider_subscription_id, cohort=sub.cohort,
                                   subscription_pk=sub.pk, now=run.now):
            return
        slot = due_reminder_slot(spec.reminders_before_grace_end, cycle.grace_expires_at, run.now)
        if slot is None:
            return
        prefix = f"reminder:{cycle.cycle_id}:{cycle.grace_expires_at.isoformat()}:"
        sent = OutboxMessage.objects.filter(dedupe_key__startswith=prefix).aggregate(n=Max("dedupe_key"))["n"]
        if sent is not None and int(sent.rsplit(":", 1)[1]) >= slot:
            return
        OutboxMessage.objects.create(
            topic="notification.requested", dedupe_key=reminder_key(cycle, slot), subscription=sub, created_at=run.now,
            payload={"subscription": sub.pk, "cycle": str(cycle.cycle_id), "template": "grace_reminder",
                     "template_generation": spec.template_generation, "state": cycle.state, "slot": slot,
                     "grace_expires_at": cycle.grace_expires_at.isoformat()},
        )
    run.changed += 1
