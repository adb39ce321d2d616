"""The `alerts` job (SPEC §10, §15), every minute: paid but not restored, two successful charges
for one invoice, and a payment-failure-rate spike against the 7-day mean.

Each condition is raised through `alert_raise`, so a condition seen on every run stays one alert
whose `occurrences` count the runs that saw it. This job resolves only what it can see clear:
PAID_NOT_RESTORED once the invoice's access is restored, CANCEL_UNCONFIRMED once the provider
confirmed, UNKNOWN_UNOWNED once the unknown payment has an owner (or is no longer unknown).
DUPLICATE_CHARGE, FAILURE_RATE_SPIKE and RECONCILIATION_MISMATCH stay open until a person resolves
them (`alert_resolve` refuses a job those kinds).

Definitions (time is `run.now`; settings are read with these defaults):

- PAID_NOT_RESTORED — paid evidence for an invoice (an `invoice.paid` / `invoice.payment_succeeded`
  provider event, or a PAYMENT_SUCCEEDED fact) first arrived between DUNNING_ALERT_LOOKBACK_DAYS (7)
  days and DUNNING_ALERT_PAID_NOT_RESTORED_SECONDS (60) seconds ago, and access is still not
  restored: the invoice has no local cycle while one of its paid events is still PENDING or
  FAILED; or its cycle is not RECOVERED / CLOSED_VOID (a cycle reopened by a lost dispute is
  exempt); or the cycle is settled, the recomputed aggregate asks for FULL (no blocking cycle
  remains), the policy enforces access for the subscription, and the subscription is not FULL.
  One alert per provider invoice id.
- DUPLICATE_CHARGE — for an invoice with a successful payment recorded within the lookback:
  more than one distinct non-empty provider_ref among its PAYMENT_SUCCEEDED facts, or more than
  one SUCCEEDED PaymentAttempt on its cycle, or more than one distinct charge among its
  attributed `charge.succeeded` provider events. One alert per provider invoice id.
- FAILURE_RATE_SPIKE — PAYMENT_FAILED ÷ (PAYMENT_FAILED + PAYMENT_SUCCEEDED) facts by
  `occurred_at` in the 24 h before now, when that sample has at least
  DUNNING_FAILURE_SPIKE_MIN_ATTEMPTS (20) facts, is above both the mean of the daily rates of
  the 7 days before that (days without attempts are left out) × DUNNING_FAILURE_SPIKE_FACTOR
  (2.0) and the floor DUNNING_FAILURE_SPIKE_MIN_RATE (0.05). No baseline day, no alert.
  One alert per UTC day it is seen.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, F, Min, Q, QuerySet
from django.db.models.fields.json import KT

from dunning.acceptance.settlement import compute_aggregate
from dunning.actions.alerts import EPISODE_SEPARATOR, alert_raise, alert_resolve, duplicate_charge_invoices
from dunning.actions.local_retry import KEY_RESEND_WINDOW
from dunning.jobs.framework import JobReport, ahead_of_the_clock, job_setting, one_worker_at_a_time, scheduled_job
from dunning.models import (
    PAID_EVENT_TYPES,
    Alert,
    AlertKind,
    DunningCycle,
    EventOutcome,
    FactKind,
    MonetaryFact,
    OutboxMessage,
    PaymentAttempt,
    ProviderEvent,
)
from dunning.policy.cache import policy_spec
from dunning.policy.rollout import enforces_access
from dunning.states import SETTLED_STATES, AttemptState, CycleState
from entitlements.profiles import FULL
from subscriptions.models import Invoice, Subscription

log = logging.getLogger(__name__)
JOB = "alerts"
RESOLVED_BY = "job:alerts"
UNFINISHED_OUTCOMES = (EventOutcome.PENDING, EventOutcome.FAILED)
BATCH = 500


@scheduled_job(JOB, "Alerts: paid but not restored (> 60 s), duplicate charges, failure-rate spike vs 7-day mean, "
                   "provider cancellation unconfirmed after an hour, unknown payments past key retention")
@one_worker_at_a_time(JOB, "the alerts job")
def alerts(run: JobReport) -> None:
    for check in (check_paid_not_restored, check_duplicate_charges, check_failure_rate_spike,
                  check_cancel_unconfirmed, resolve_unknown_owned, check_unknown_past_retention):
        try:
            check(run)
        except Exception as exc:  # one broken check must not silence the others
            log.exception("alerts: %s failed", check.__name__)
            run.errors += 1
            run.note(f"{check.__name__} failed: {type(exc).__name__}: {exc}")


def _lookback_start(now: datetime) -> datetime:
    """The oldest evidence the paid-not-restored and duplicate-charge checks look at."""
    return now - timedelta(days=float(job_setting("DUNNING_ALERT_LOOKBACK_DAYS", 7)))


def _count(run: JobReport, alert: Alert) -> None:
    if alert.occurrences == 1:
        run.changed += 1
        run.note(f"raised {alert.kind} [{alert.dedupe_key}]")


# --------------------------------------------------------------------------- paid, not restored


@dataclass(frozen=True)
class PaidEvidence:
    provider: str
    invoice_id: str  # the provider's invoice id
    first_seen: datetime
    unfinished_events: int


def _keyset(page: Callable[[tuple[str, str] | None], list[dict]], key: Callable[[dict], tuple[str, str]]
            ) -> Iterator[dict]:
    last: tuple[str, str] | None = None
    while True:
        rows = page(last)
        if not rows:
            return
        yield from rows
        last = key(rows[-1])


# The common case, settled in SQL so the every-minute scan only looks at the rest: the invoice's
# cycle is settled and its subscription is FULL (`not_restored_reason` would say "").
_PLAINLY_RESTORED = Q(invoice__cycle__state__in=SETTLED_STATES, invoice__subscription__entitlement_profile=FULL)


def _paid_events(since: datetime, cutoff: datetime) -> Iterator[PaidEvidence]:
    """Provider invoices with a paid event received in [since, cutoff], one row each, in id order."""
    base = (ProviderEvent.objects.filter(event_type__in=PAID_EVENT_TYPES, received_at__gte=since,
                                         received_at__lte=cutoff)
            .exclude(_PLAINLY_RESTORED & ~Q(outcome__in=UNFINISHED_OUTCOMES))
            .annotate(inv=KT("payload__data__object__id")).exclude(inv__isnull=True).exclude(inv=""))

    def page(last: tuple[str, str] | None) -> list[dict]:
        qs = base if last is None else base.filter(Q(provider__gt=last[0]) | Q(provider=last[0], inv__gt=last[1]))
        return list(qs.values("provider", "inv").annotate(
            first=Min("received_at"), unfinished=Count("pk", filter=Q(outcome__in=UNFINISHED_OUTCOMES)),
        ).order_by("provider", "inv")[:BATCH])

    for row in _keyset(page, lambda r: (r["provider"], r["inv"])):
        yield PaidEvidence(row["provider"], row["inv"], row["first"], row["unfinished"])


def _paid_facts(since: datetime, cutoff: datetime) -> Iterator[PaidEvidence]:
    """Invoices with a PAYMENT_SUCCEEDED fact recorded in [since, cutoff], one row each."""
    base = MonetaryFact.objects.filter(kind=FactKind.PAYMENT_SUCCEEDED, recorded_at__gte=since,
                                       recorded_at__lte=cutoff).exclude(_PLAINLY_RESTORED)

    def page(last: tuple[str, str] | None) -> list[dict]:
        qs = base if last is None else base.filter(
            Q(invoice__provider__gt=last[0]) | Q(invoice__provider=last[0], invoice__provider_invoice_id__gt=last[1]))
        return list(qs.values("invoice__provider", "invoice__provider_invoice_id").annotate(
            first=Min("recorded_at")).order_by("invoice__provider", "invoice__provider_invoice_id")[:BATCH])

    for row in _keyset(page, lambda r: (r["invoice__provider"], r["invoice__provider_invoice_id"])):
        yield PaidEvidence(row["invoice__provider"], row["invoice__provider_invoice_id"], row["first"], 0)


def _batched(rows: Iterator[PaidEvidence], size: int = BATCH) -> Iterator[list[PaidEvidence]]:
    batch: list[PaidEvidence] = []
    for row in rows:
        batch.append(row)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _local_invoices(keys: list[tuple[str, str]]) -> dict[tuple[str, str], Invoice]:
    ids = {invoice_id for _, invoice_id in keys}
    found = (Invoice.objects.filter(provider_invoice_id__in=ids)
             .select_related("cycle", "subscription", "subscription__policy"))
    return {(i.provider, i.provider_invoice_id): i for i in found}


def _cycle_of(invoice: Invoice | None) -> DunningCycle | None:
    if invoice is None:
        return None
    try:
        return invoice.cycle
    except DunningCycle.DoesNotExist:
        return None


def not_restored_reason(invoice: Invoice | None, *, unfinished_events: int) -> str:
    """Why the paid invoice's access is not restored, or "" when it is (or there is nothing to restore)."""
    cycle = _cycle_of(invoice)
    pending = f"; {unfinished_events} paid event(s) still unprocessed" if unfinished_events else ""
    if cycle is None:
        # Processed events without a cycle were not ours to restore (quarantined, unattributable, ignored).
        return f"no local dunning cycle for the invoice{pending}" if unfinished_events else ""
    if cycle.state not in SETTLED_STATES:
        if cycle.dispute_reopened:
            return ""  # a lost dispute reopened the debt: not being restored is the policy
        return f"its dunning cycle is still {cycle.state}{pending}"
    subscription = invoice.subscription
    if subscription.entitlement_profile == FULL:
        return ""
    spec = policy_spec(subscription.policy)
    if not enforces_access(spec, subscription_key=subscription.provider_subscription_id, cohort=subscription.cohort,
                           subscription_pk=subscription.pk):
        return ""
    _, decision = compute_aggregate(subscription, None)
    if decision.profile != FULL:
        return ""  # other debt still blocks: staying limited is correct
    return (f"its cycle is {cycle.state} and no blocking cycle remains, but the subscription's entitlement is still "
            f"{subscription.entitlement_profile} (generation {subscription.entitlement_generation})")


def _paid_not_restored_key(provider_invoice_id: str) -> str:
    return f"paid_not_restored:{provider_invoice_id}"


def check_paid_not_restored(run: JobReport) -> None:
    threshold = timedelta(seconds=float(job_setting("DUNNING_ALERT_PAID_NOT_RESTORED_SECONDS", 60)))
    since = _lookback_start(run.now)
    cutoff = run.now - threshold
    seen: set[tuple[str, str]] = set()
    firing: set[str] = set()
    for source in (_paid_events(since, cutoff), _paid_facts(since, cutoff)):
        for batch in _batched(source):
            batch = [e for e in batch if (e.provider, e.invoice_id) not in seen]
            seen.update((e.provider, e.invoice_id) for e in batch)
            invoices = _local_invoices([(e.provider, e.invoice_id) for e in batch])
            for evidence in batch:
                run.examined += 1
                run.tick()
                invoice = invoices.get((evidence.provider, evidence.invoice_id))
                reason = not_restored_reason(invoice, unfinished_events=evidence.unfinished_events)
                if not reason:
                    continue
                firing.add(evidence.invoice_id)
                waited = int((run.now - evidence.first_seen).total_seconds())
                cycle = _cycle_of(invoice)
                alert = alert_raise(
                    kind=AlertKind.PAID_NOT_RESTORED, dedupe_key=_paid_not_restored_key(evidence.invoice_id),
                    detail=(f"Invoice {evidence.invoice_id} was paid (first evidence "
                            f"{evidence.first_seen:%Y-%m-%d %H:%M:%S} UTC, {waited} s ago) but access is not "
                            f"restored: {reason}."),
                    figures={"provider_invoice_id": evidence.invoice_id, "first_paid_evidence_at":
                             evidence.first_seen.isoformat(), "seconds_waited": waited,
                             "unfinished_events": evidence.unfinished_events,
                             "cycle_state": cycle.state if cycle else None,
                             "entitlement_profile": invoice.subscription.entitlement_profile if invoice else None},
                    now=run.now, subscription=invoice.subscription if invoice else None, invoice=invoice,
                )
                _count(run, alert)
    _resolve_restored(run, firing)


def _resolve_restored(run: JobReport, firing: set[str]) -> None:
    """Resolve open PAID_NOT_RESTORED alerts whose invoice is restored now. Alerts about invoices
    outside the lookback are re-checked too, so an old one is never resolved by ageing out."""
    open_alerts = Alert.objects.filter(kind=AlertKind.PAID_NOT_RESTORED, resolved_at__isnull=True).select_related(
        "invoice", "invoice__cycle", "invoice__subscription", "invoice__subscription__policy")
    for alert in open_alerts.order_by("pk").iterator(chunk_size=BATCH):
        provider_invoice_id = str(alert.figures.get("provider_invoice_id") or "")
        if provider_invoice_id in firing:
            continue
        if not provider_invoice_id:
            continue  # nothing to re-check it against; a person resolves it
        invoice = alert.invoice or Invoice.objects.filter(provider_invoice_id=provider_invoice_id).select_related(
            "cycle", "subscription", "subscription__policy").first()
        unfinished = ProviderEvent.objects.filter(
            event_type__in=PAID_EVENT_TYPES, outcome__in=UNFINISHED_OUTCOMES,
            payload__data__object__id=provider_invoice_id).count()
        if not_restored_reason(invoice, unfinished_events=unfinished):
            continue
        alert_resolve(alert, by=RESOLVED_BY, now=run.now, note="access restored")
        run.changed += 1
        run.note(f"resolved {alert.kind} [{alert.dedupe_key}]: access restored")


# --------------------------------------------------------------------------- duplicate charges


def _grouped_invoice_ids(queryset: QuerySet, invoice_field: str, counted: str, *, distinct: bool) -> set[int]:
    rows = (queryset.values(invoice_field).annotate(n=Count(counted, distinct=distinct)).filter(n__gt=1)
            .values_list(invoice_field, flat=True))
    return set(rows)


def check_duplicate_charges(run: JobReport) -> None:
    since = _lookback_start(run.now)
    recent_paid = MonetaryFact.objects.filter(kind=FactKind.PAYMENT_SUCCEEDED, recorded_at__gte=since,
                                              recorded_at__lte=run.now).values("invoice_id")
    recent_attempts = PaymentAttempt.objects.filter(state=AttemptState.SUCCEEDED, resolved_at__gte=since,
                                                    resolved_at__lte=run.now).values("cycle_id")
    recent_charges = ProviderEvent.objects.filter(event_type="charge.succeeded", received_at__gte=since,
                                                  received_at__lte=run.now, invoice__isnull=False).values("invoice_id")
    facts, attempts = duplicate_charge_invoices(facts=MonetaryFact.objects.filter(invoice_id__in=recent_paid),
                                                attempts=PaymentAttempt.objects.filter(cycle_id__in=recent_attempts))
    by_facts, by_attempts = set(facts), set(attempts)
    by_events = _grouped_invoice_ids(
        ProviderEvent.objects.filter(event_type="charge.succeeded", invoice_id__in=recent_charges)
        .annotate(charge=KT("payload__data__object__id")), "invoice_id", "charge", distinct=True)
    suspects = sorted(by_facts | by_attempts | by_events)
    for start in range(0, len(suspects), BATCH):
        chunk = suspects[start:start + BATCH]
        for invoice in Invoice.objects.filter(pk__in=chunk).select_related("subscription").order_by("pk"):
            run.examined += 1
            run.tick()
            refs = sorted(set(
                MonetaryFact.objects.filter(invoice=invoice, kind=FactKind.PAYMENT_SUCCEEDED).exclude(provider_ref="")
                .values_list("provider_ref", flat=True)))
            attempts = list(PaymentAttempt.objects.filter(cycle__invoice=invoice, state=AttemptState.SUCCEEDED)
                            .values_list("provider_payment_ref", flat=True))
            charges = sorted(set(ProviderEvent.objects.filter(event_type="charge.succeeded", invoice=invoice)
                                 .values_list(KT("payload__data__object__id"), flat=True)))
            seen_by = [name for name, hit in (("money facts", invoice.pk in by_facts),
                                              ("payment attempts", invoice.pk in by_attempts),
                                              ("provider charge events", invoice.pk in by_events)) if hit]
            alert = alert_raise(
                kind=AlertKind.DUPLICATE_CHARGE, dedupe_key=f"duplicate_charge:{invoice.provider_invoice_id}",
                detail=(f"Invoice {invoice.provider_invoice_id} ({invoice.amount_due} {invoice.currency.upper()}) "
                        f"looks charged more than once, according to {' and '.join(seen_by)}: payment references "
                        f"{', '.join(refs) or '—'}; {len(attempts)} succeeded attempt(s); charges "
                        f"{', '.join(charges) or '—'}. Check the provider and refund the extra charge."),
                figures={"provider_invoice_id": invoice.provider_invoice_id, "payment_refs": refs,
                         "succeeded_attempts": len(attempts), "attempt_refs": attempts, "charges": charges,
                         "amount_due": invoice.amount_due, "currency": invoice.currency},
                now=run.now, subscription=invoice.subscription, invoice=invoice,
            )
            _count(run, alert)


# --------------------------------------------------------------------------- failure-rate spike


def failure_rates(now: datetime) -> dict[str, Any]:
    """Today's (last 24 h) failure rate and the 7 daily rates before it, in one pass over the facts."""
    day = timedelta(days=1)
    buckets: dict[str, Any] = {}
    for n in range(8):
        window = Q(occurred_at__gt=now - (n + 1) * day, occurred_at__lte=now - n * day)
        buckets[f"f{n}"] = Count("pk", filter=window & Q(kind=FactKind.PAYMENT_FAILED))
        buckets[f"s{n}"] = Count("pk", filter=window & Q(kind=FactKind.PAYMENT_SUCCEEDED))
    counts = MonetaryFact.objects.filter(
        kind__in=(FactKind.PAYMENT_FAILED, FactKind.PAYMENT_SUCCEEDED),
        occurred_at__gt=now - 8 * day, occurred_at__lte=now,
    ).aggregate(**buckets)
    days = []
    for n in range(8):
        failed, succeeded = counts[f"f{n}"] or 0, counts[f"s{n}"] or 0
        attempts = failed + succeeded
        days.append({"failed": failed, "attempts": attempts, "rate": failed / attempts if attempts else None})
    baseline = [d["rate"] for d in days[1:] if d["rate"] is not None]
    return {"today": days[0], "previous_days": days[1:],
            "baseline_mean": sum(baseline) / len(baseline) if baseline else None, "baseline_days": len(baseline)}


def check_failure_rate_spike(run: JobReport) -> None:
    factor = float(job_setting("DUNNING_FAILURE_SPIKE_FACTOR", 2.0))
    min_attempts = int(job_setting("DUNNING_FAILURE_SPIKE_MIN_ATTEMPTS", 20))
    floor = float(job_setting("DUNNING_FAILURE_SPIKE_MIN_RATE", 0.05))
    rates = failure_rates(run.now)
    run.examined += 1
    today, mean = rates["today"], rates["baseline_mean"]
    if today["attempts"] < min_attempts or mean is None:
        return
    threshold = max(mean * factor, floor)
    if today["rate"] <= threshold:
        return
    alert = alert_raise(
        kind=AlertKind.FAILURE_RATE_SPIKE, dedupe_key=f"failure_rate_spike:{run.now:%Y-%m-%d}",
        detail=(f"{today['failed']} of {today['attempts']} payment attempts failed in the last 24 h "
                f"({today['rate']:.1%}), above {threshold:.1%} ({factor:g} × the 7-day mean daily rate of "
                f"{mean:.1%} over {rates['baseline_days']} day(s) with attempts)."),
        figures={**rates, "factor": factor, "threshold": threshold, "min_attempts": min_attempts, "floor": floor},
        now=run.now,
    )
    _count(run, alert)


# --------------------------------------------------------------------------- cancellation unconfirmed


def _cancel_key(subscription: Subscription) -> str:
    return f"cancel_unconfirmed:{subscription.provider_subscription_id}"


def check_cancel_unconfirmed(run: JobReport) -> None:
    """A dunning cancellation the provider has not confirmed within the hour: the customer was told
    the subscription ended while the provider may still invoice and retry them."""
    limit = timedelta(seconds=float(job_setting("DUNNING_PROVIDER_CANCEL_ALERT_SECONDS", 3600)))
    waiting = Subscription.objects.filter(provider_cancel_requested_at__lte=run.now - limit,
                                          provider_cancel_confirmed_at__isnull=True)
    for sub in waiting.order_by("pk").iterator(chunk_size=BATCH):
        run.examined += 1
        message = OutboxMessage.objects.filter(topic="provider.cancel_subscription", subscription=sub).first()
        last_error = message.last_error if message else "no outbox message"
        alert = alert_raise(
            kind=AlertKind.CANCEL_UNCONFIRMED, dedupe_key=_cancel_key(sub),
            detail=(f"Subscription {sub.provider_subscription_id} was canceled by dunning at "
                    f"{sub.provider_cancel_requested_at.isoformat()} and the provider has not confirmed it; it may "
                    f"still invoice and retry the customer. Last error: {last_error or 'none'}."),
            figures={"provider_subscription_id": sub.provider_subscription_id,
                     "requested_at": sub.provider_cancel_requested_at.isoformat(),
                     "attempts": message.delivery_attempts if message else 0},
            now=run.now, subscription=sub,
        )
        _count(run, alert)
    confirmed = Alert.objects.filter(kind=AlertKind.CANCEL_UNCONFIRMED, resolved_at__isnull=True,
                                     subscription__provider_cancel_confirmed_at__isnull=False)
    for alert in confirmed:
        alert_resolve(alert, by=RESOLVED_BY, now=run.now, note="the provider confirmed the cancellation")
        run.changed += 1
        run.note(f"resolved {alert.kind} [{alert.dedupe_key}]: the provider confirmed")


# --------------------------------------------------------------------------- unknown payment, no owner


def resolve_unknown_owned(run: JobReport) -> None:
    """UNKNOWN_UNOWNED (raised by the unknown_payments job) clears once the payment has an owner or
    its outcome is known."""
    open_alerts = Alert.objects.filter(kind=AlertKind.UNKNOWN_UNOWNED, resolved_at__isnull=True).select_related(
        "invoice__cycle__unknown_owner")
    for alert in open_alerts.order_by("pk").iterator(chunk_size=BATCH):
        cycle = _cycle_of(alert.invoice)
        if cycle is None or (cycle.state == CycleState.PAYMENT_UNKNOWN and cycle.unknown_owner_id is None):
            continue
        if cycle.state == CycleState.PAYMENT_UNKNOWN:
            note = f"the unknown payment is owned by {cycle.unknown_owner.get_username()}"
        else:
            note = f"the payment's outcome is known (cycle {cycle.state})"
        alert_resolve(alert, by=RESOLVED_BY, now=run.now, note=note)
        run.changed += 1
        run.note(f"resolved {alert.kind} [{alert.dedupe_key}]: {note}")


# --------------------------------------------------------------------------- unknown past key retention


def _past_retention_key(attempt: PaymentAttempt) -> str:
    return f"unknown_past_retention:{attempt.operation_id}"


def check_unknown_past_retention(run: JobReport) -> None:
    """A payment whose outcome is still unknown once the provider no longer honours its
    idempotency key: no job may resend it, so only its owner or a billing lead can resolve it
    (Resolve unknown payment). The alert stays open, visible on the alert list, until the attempt
    has an outcome; grace cannot expire meanwhile (the attempt in flight holds it)."""
    if ahead_of_the_clock(run):
        return  # "past retention" at a now the clock has not reached would be an alarm from the future
    cutoff = run.now - KEY_RESEND_WINDOW
    stuck = (PaymentAttempt.objects.filter(state=AttemptState.UNKNOWN, dispatched_at__lte=cutoff,
                                           cycle__pending_attempt=F("pk"))
             .select_related("cycle__invoice", "cycle__subscription", "cycle__unknown_owner"))
    firing: set[str] = set()
    for attempt in stuck.order_by("pk").iterator(chunk_size=BATCH):
        run.examined += 1
        cycle = attempt.cycle
        key = _past_retention_key(attempt)
        firing.add(key)
        owner = cycle.unknown_owner.get_username() if cycle.unknown_owner_id else "nobody yet"
        alert = alert_raise(
            kind=AlertKind.UNKNOWN_PAST_RETENTION, dedupe_key=key,
            detail=(f"The outcome of payment attempt {attempt.operation_id} on invoice "
                    f"{cycle.invoice.provider_invoice_id} is unknown since {attempt.dispatched_at.isoformat()}, "
                    f"past the provider's idempotency-key retention: it cannot be resent safely. Owner: {owner}. "
                    f"Open the subscription and use 'Resolve unknown payment' (fetches the invoice and its "
                    f"payments fresh)."),
            figures={"operation_id": str(attempt.operation_id), "idempotency_key": attempt.idempotency_key,
                     "dispatched_at": attempt.dispatched_at.isoformat(), "cycle_state": cycle.state},
            now=run.now, subscription=cycle.subscription, invoice=cycle.invoice,
        )
        _count(run, alert)
    still_open = Alert.objects.filter(kind=AlertKind.UNKNOWN_PAST_RETENTION, resolved_at__isnull=True)
    for alert in still_open.order_by("pk").iterator(chunk_size=BATCH):
        if alert.dedupe_key.split(EPISODE_SEPARATOR)[0] in firing:
            continue
        attempt = PaymentAttempt.objects.filter(operation_id=alert.figures.get("operation_id")).first()
        note = (f"the attempt's outcome is known ({attempt.state})" if attempt is not None
                else "the attempt is no longer pending")
        alert_resolve(alert, by=RESOLVED_BY, now=run.now, note=note)
        run.changed += 1
        run.note(f"resolved {alert.kind} [{alert.dedupe_key}]: {note}")
