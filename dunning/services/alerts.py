"""Raising and resolving operational alerts (SPEC §10, §15).

One alert row is one *episode* of one condition. `dedupe_key` names the condition (for example
`paid_not_restored:in_123`); while an episode is unresolved, raising the same key again only
bumps `occurrences` and `last_seen_at`, so a job that sees the condition every minute keeps one
row. A resolved episode is never reopened: when the condition comes back, a new episode is
stored under `<key>#2`, `<key>#3`, … so each resolution (who, when) stays on record.

Alerts are append-only apart from the bookkeeping fields (`Alert.MUTABLE_FIELDS`); `detail` and
`figures` are what was seen when the episode was first raised. Two workers raising the same key
at once end with one row: the unique `dedupe_key` decides, the loser bumps the winner's row.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.db.models.functions import Greatest

from dunning.models import Alert
from subscriptions.models import Invoice, Subscription

log = logging.getLogger(__name__)
EPISODE_SEPARATOR = "#"
MAX_TRIES = 5


def _episodes(dedupe_key: str):  # noqa: ANN202 - an Alert queryset
    return Alert.objects.filter(Q(dedupe_key=dedupe_key) | Q(dedupe_key__startswith=dedupe_key + EPISODE_SEPARATOR))


def alert_open_for(dedupe_key: str) -> Alert | None:
    """The unresolved episode of the condition `dedupe_key`, if there is one."""
    return _episodes(dedupe_key).filter(resolved_at__isnull=True).order_by("-raised_at", "-pk").first()


def _episode_key(dedupe_key: str, episode: int) -> str:
    return dedupe_key if episode == 1 else f"{dedupe_key}{EPISODE_SEPARATOR}{episode}"


def alert_raise(
    *,
    kind: str,
    dedupe_key: str,
    detail: str,
    figures: dict[str, Any],
    now: datetime,
    subscription: Subscription | None = None,
    invoice: Invoice | None = None,
) -> Alert:
    """Store a new alert episode for `dedupe_key`, or count one more sighting of the open one.

    Returns the episode; `occurrences == 1` means it was raised by this call.
    """
    if not dedupe_key or EPISODE_SEPARATOR in dedupe_key:
        raise ValueError(f"an alert dedupe key must be non-empty and free of {EPISODE_SEPARATOR!r}: {dedupe_key!r}")
    for _ in range(MAX_TRIES):
        # One read gives both the open episode and the next episode number, so a worker that
        # lost a race inserts the same key as the winner and fails on the unique constraint
        # (then bumps the winner's row) instead of opening a second episode beside it.
        episodes = list(_episodes(dedupe_key).values_list("pk", "resolved_at"))
        open_pk = next((pk for pk, resolved_at in episodes if resolved_at is None), None)
        if open_pk is not None:
            bumped = Alert.objects.filter(pk=open_pk, resolved_at__isnull=True).update(
                occurrences=F("occurrences") + 1, last_seen_at=Greatest(F("last_seen_at"), now),
            )
            if bumped:
                alert = Alert.objects.get(pk=open_pk)
                log.info("alert %s [%s] seen again (%d occurrences)", kind, alert.dedupe_key, alert.occurrences)
                return alert
            continue  # resolved between the read and the update: raise a new episode
        try:
            with transaction.atomic():
                alert = Alert.objects.create(
                    kind=kind, dedupe_key=_episode_key(dedupe_key, len(episodes) + 1), subscription=subscription,
                    invoice=invoice, detail=detail, figures=figures, raised_at=now, last_seen_at=now, occurrences=1,
                )
        except IntegrityError:
            continue  # another worker stored this episode first; bump theirs
        log.warning("ALERT %s [%s]: %s", kind, alert.dedupe_key, detail)
        return alert
    raise RuntimeError(f"could not raise or bump alert {dedupe_key!r} after {MAX_TRIES} tries")


def alert_resolve(alert: Alert, *, by: Any, now: datetime) -> Alert:
    """Mark the episode resolved by `by` (a user or a name such as "job:alerts"). Resolving a
    resolved episode changes nothing."""
    name = by.get_username() if hasattr(by, "get_username") else str(by)
    resolved = Alert.objects.filter(pk=alert.pk, resolved_at__isnull=True).update(resolved_at=now,
                                                                                  resolved_by=name[:150])
    alert.refresh_from_db()
    if resolved:
        log.info("alert %s [%s] resolved by %s", alert.kind, alert.dedupe_key, name)
    return alert
