"""Raising and resolving operational alerts (SPEC §10, §15).

One alert row is one *episode* of one condition. `dedupe_key` names the condition (for example
`paid_not_restored:in_123`); while an episode is unresolved, raising the same key again only
bumps `occurrences` and `last_seen_at`, so a job that sees the condition every minute keeps one
row. A resolved episode is never reopened: when the condition comes back, a new episode is
stored under `<key>#2`, `<key>#3`, … so each resolution (who, when) stays on record.

Alerts are append-only apart from the bookkeeping fields (`Alert.MUTABLE_FIELDS`); `detail` and
`figures` are what was seen when the episode was first raised. Two workers raising the same key
at once end with one row: the unique `dedupe_key` decides, the loser bumps the winner's row.

Handling (issue 15): staff acknowledge an alert (they own it from then on; acknowledging someone
else's takes it over) and resolve it with a note; every decision is one append-only AlertAction
(who, what, when, note), and the job's own resolutions are recorded the same way. A job resolves
only conditions it can see clear; DUPLICATE_CHARGE, FAILURE_RATE_SPIKE and RECONCILIATION_MISMATCH
(`ALERT_KINDS_RESOLVED_BY_A_PERSON`) are refused to anything but a person. Once a person resolved
such an episode, seeing the *same* evidence again (the same charges; the same day's spike; the
same report) is counted on that episode instead of opening a new one every minute: the evidence
is append-only and will go on showing the condition. New evidence (a third charge) opens a new
episode.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import Count, F, Q, QuerySet
from django.db.models.functions import Greatest

from dunning.actions.alert_delivery import alert_delivery_request
from dunning.clock import trusted_now
from dunning.models import Alert, AlertKind, FactKind, MonetaryFact, PaymentAttempt
from dunning.models.operations import ALERT_KINDS_RESOLVED_BY_A_PERSON, AlertAction, AlertActionKind
from dunning.refusals import CodedRefusal
from dunning.states import AttemptState
from subscriptions.models import Invoice, Subscription

log = logging.getLogger(__name__)
EPISODE_SEPARATOR = "#"
MAX_TRIES = 5

# What identifies the evidence of a person-resolved condition: the same values seen again are the
# same condition, still visible in append-only data, not a new one.
SETTLED_EVIDENCE: dict[str, tuple[str, ...]] = {
    AlertKind.DUPLICATE_CHARGE: ("payment_refs", "attempt_refs", "charges"),
    AlertKind.FAILURE_RATE_SPIKE: (),  # one key per UTC day
    AlertKind.RECONCILIATION_MISMATCH: (),  # one key per report
}


def duplicate_charge_invoices(*, facts: QuerySet[MonetaryFact] | None = None,
                              attempts: QuerySet[PaymentAttempt] | None = None) -> tuple[QuerySet, QuerySet]:
    """Invoices charged more than once, as two flat querysets of invoice pks: by money facts (more
    than one distinct non-empty provider_ref among their PAYMENT_SUCCEEDED facts) and by payment
    attempts (more than one SUCCEEDED attempt on their cycle). `facts` and `attempts` narrow the
    rows counted (all of them by default). Used by the alerts job and the duplicate_charges gate."""
    paid = (MonetaryFact.objects.all() if facts is None else facts).filter(kind=FactKind.PAYMENT_SUCCEEDED)
    by_facts = (paid.exclude(provider_ref="").values("invoice_id")
                .annotate(n=Count("provider_ref", distinct=True)).filter(n__gt=1).values_list("invoice_id", flat=True))
    succeeded = (PaymentAttempt.objects.all() if attempts is None else attempts).filter(state=AttemptState.SUCCEEDED)
    by_attempts = (succeeded.values("cycle__invoice_id").annotate(n=Count("pk")).filter(n__gt=1)
                   .values_list("cycle__invoice_id", flat=True))
    return by_facts, by_attempts


class AlertRefused(CodedRefusal):
    """The decision cannot be taken; `detail` says why in plain words."""


@dataclass(frozen=True)
class AlertDecision:
    alert: Alert
    action: AlertAction | None  # None: nothing changed (acknowledging an alert you already own)
    text: str


def _episodes(dedupe_key: str):  # noqa: ANN202 - an Alert queryset
    return Alert.objects.filter(Q(dedupe_key=dedupe_key) | Q(dedupe_key__startswith=dedupe_key + EPISODE_SEPARATOR))


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
        if open_pk is None and kind in SETTLED_EVIDENCE:
            settled = _settled_by_a_person(dedupe_key, kind, figures, now)
            if settled is not None:
                return settled
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
                # Same transaction: a new episode is announced once it commits, and only then.
                alert_delivery_request(alert=alert, now=now)
        except IntegrityError:
            continue  # another worker stored this episode first; bump theirs
        log.warning("ALERT %s [%s]: %s", kind, alert.dedupe_key, detail)
        return alert
    raise RuntimeError(f"could not raise or bump alert {dedupe_key!r} after {MAX_TRIES} tries")


def _evidence(kind: str, figures: dict[str, Any]) -> dict[str, Any]:
    def norm(value: Any) -> Any:
        return sorted(str(v) for v in value) if isinstance(value, list | tuple) else value

    return {name: norm(figures.get(name)) for name in SETTLED_EVIDENCE[kind]}


def _settled_by_a_person(dedupe_key: str, kind: str, figures: dict[str, Any], now: datetime) -> Alert | None:
    """The latest episode, when a person resolved it on the evidence seen now: counted there."""
    latest = _episodes(dedupe_key).order_by("-raised_at", "-pk").first()
    if latest is None or latest.resolved_at is None or latest.resolved_by.startswith("job:"):
        return None
    if _evidence(kind, latest.figures) != _evidence(kind, figures):
        return None
    Alert.objects.filter(pk=latest.pk).update(occurrences=F("occurrences") + 1,
                                              last_seen_at=Greatest(F("last_seen_at"), now))
    latest.refresh_from_db()
    return latest


def _is_person(by: Any) -> bool:
    return isinstance(by, get_user_model())


def _record(alert: Alert, action: str, by: Any, note: str, now: datetime, previous_owner: str = "") -> AlertAction:
    person = _is_person(by)
    actor = by.get_username() if person else str(by)
    return AlertAction.objects.create(alert=alert, action=action, actor=actor[:150], actor_user=by if person else None,
                                      note=note, previous_owner=previous_owner, at=now)


def alert_resolve(alert: Alert, *, by: Any, now: datetime, note: str = "") -> Alert:
    """Mark the episode resolved by `by` (a user, or a name such as "job:alerts" when a job saw the
    condition clear), with an AlertAction. Resolving a resolved episode changes nothing. Raises
    AlertRefused when anything but a person resolves a kind only a person may resolve."""
    if alert.kind in ALERT_KINDS_RESOLVED_BY_A_PERSON and not _is_person(by):
        raise AlertRefused("NEEDS_A_PERSON", f"{alert.get_kind_display()} alerts are resolved by a person, "
                                             f"not by {by}")
    name = by.get_username() if hasattr(by, "get_username") else str(by)
    with transaction.atomic():
        resolved = Alert.objects.filter(pk=alert.pk, resolved_at__isnull=True).update(
            resolved_at=now, resolved_by=name[:150], resolution_note=note)
        if resolved:
            _record(alert, AlertActionKind.RESOLVE, by, note, now)
    alert.refresh_from_db()
    if resolved:
        log.info("alert %s [%s] resolved by %s", alert.kind, alert.dedupe_key, name)
    return alert


def _resolved_text(alert: Alert) -> str:
    note = f" (“{alert.resolution_note}”)" if alert.resolution_note else ""
    return f"This alert was already resolved by {alert.resolved_by} at {alert.resolved_at:%Y-%m-%d %H:%M} UTC{note}."


def alert_acknowledge(*, alert_pk: int, user: Any, note: str = "", now: datetime | None = None) -> AlertDecision:
    """`user` owns the alert from now on (taking it over from its owner, if another). Acknowledging
    an alert you own records only a note, if you give one. A resolved alert is refused."""
    now = now or trusted_now()
    note = (note or "").strip()
    with transaction.atomic():
        alert = Alert.objects.select_for_update().get(pk=alert_pk)
        if alert.resolved_at is not None:
            raise AlertRefused("ALERT_RESOLVED", _resolved_text(alert) + " There is nothing left to take on.")
        previous = alert.owner
        if previous is not None and previous.pk == user.pk:
            if not note:
                return AlertDecision(alert, None, f"You already own this alert (since "
                                                  f"{alert.acknowledged_at:%Y-%m-%d %H:%M} UTC).")
            action = _record(alert, AlertActionKind.ACKNOWLEDGE, user, note, now, previous_owner=user.get_username())
            return AlertDecision(alert, action, "Added your note; you still own this alert.")
        alert.owner, alert.acknowledged_at = user, now
        alert.save(update_fields=["owner", "acknowledged_at"])
        action = _record(alert, AlertActionKind.ACKNOWLEDGE, user, note, now,
                         previous_owner=previous.get_username() if previous else "")
    took = f", taking it over from {previous.get_username()}" if previous else ""
    log.info("alert %s [%s] acknowledged by %s%s", alert.kind, alert.dedupe_key, user.get_username(), took)
    return AlertDecision(alert, action, f"You own this alert now{took}. Resolve it with a note once it is handled.")


def alert_resolve_by_staff(*, alert_pk: int, user: Any, note: str, now: datetime | None = None) -> AlertDecision:
    """A person resolves the alert, saying what was done. Any kind; a resolved alert is refused."""
    note = (note or "").strip()
    if not note:
        raise AlertRefused("NOTE_REQUIRED", "Say what was done: resolving an alert needs a note.")
    now = now or trusted_now()
    with transaction.atomic():
        alert = Alert.objects.select_for_update().get(pk=alert_pk)
        if alert.resolved_at is not None:
            raise AlertRefused("ALERT_RESOLVED", _resolved_text(alert))
        alert.resolved_at, alert.resolved_by, alert.resolution_note = now, user.get_username()[:150], note
        alert.save(update_fields=["resolved_at", "resolved_by", "resolution_note"])
        action = _record(alert, AlertActionKind.RESOLVE, user, note, now)
    log.info("alert %s [%s] resolved by %s", alert.kind, alert.dedupe_key, user.get_username())
    return AlertDecision(alert, action, f"Resolved: {alert.get_kind_display().lower()} "
                                        f"({alert.dedupe_key}).")
