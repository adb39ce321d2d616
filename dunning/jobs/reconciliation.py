"""The daily `reconciliation` job (SPEC §10, §15): what the provider says was paid, against our
money facts and cycle states, against the entitlement each subscription holds.

It only reports. It never moves a cycle, writes a fact or issues a snapshot; what it stores is
one ReconciliationReport, a ProviderReceipt for each invoice it found in disagreement (the fresh
fetch it cites), and one RECONCILIATION_MISMATCH alert when anything disagreed.

Window: the DUNNING_RECONCILIATION_WINDOW_HOURS (24) hours before `run.now`, reaching back to the
end of the last stored report's window when a day was missed, but never more than
DUNNING_RECONCILIATION_MAX_CATCH_UP_DAYS (7) days.

Checks:
- events: the provider's events created in the window (older than
  DUNNING_RECONCILIATION_EVENT_GRACE_SECONDS = 300 s, so deliveries in flight are not counted),
  of the types the product consumes (DUNNING_RECONCILIATION_EVENT_PREFIXES), that are not in the
  inbox → EVENT_MISSING_FROM_INBOX (a lost webhook).
- invoices: every local invoice updated since the window start, whose cycle is open (not
  RECOVERED, CLOSED_VOID or CANCELED), or that has no cycle and is not final, is fetched from the
  provider and compared with its PAYMENT_SUCCEEDED facts, its mirror and its cycle state.
- subscriptions: every subscription that could hold debt or a restriction (root not the empty
  root, profile not FULL, a cycle in a delinquent state, or updated since the window start):
  stored root and profile against `compute_aggregate`, and against its latest snapshot.
  A subscription outside that set has the empty root, FULL and no delinquent cycle, which is
  exactly what recomputation gives, so nothing is missed by skipping it.
"""

from __future__ import annotations

import logging
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Exists, OuterRef, Q, QuerySet, Subquery

from dunning.aggregate import EMPTY_ROOT
from dunning.jobs.framework import JobReport, claim, scheduled_job
from dunning.models import AlertKind, DunningCycle, FactKind, MonetaryFact, ProviderEvent, ReconciliationReport
from dunning.policy_cache import policy_spec
from dunning.rollout import enforces_access
from dunning.services.alerts import alert_raise
from dunning.services.receipts import receipt_record
from dunning.services.recompute import compute_aggregate
from dunning.states import DELINQUENT_STATES, OPEN_STATES, CycleState
from entitlements.models import EntitlementSnapshot
from entitlements.profiles import FULL
from subscriptions.models import Invoice, InvoiceStatus, Subscription
from subscriptions.providers.base import PaymentProvider, ProviderError, ProviderInvoice, ProviderNotFound
from subscriptions.providers.registry import get_provider

log = logging.getLogger(__name__)
JOB = "reconciliation"
BATCH = 200
MAX_LISTED = 1000  # discrepancies kept in one report; totals count them all
EVENT_PAGE = 10_000  # events checked per run at most (paged from the provider, newest first)
DEFAULT_EVENT_PREFIXES = ("invoice.", "payment_intent.", "charge.", "customer.subscription.")
SETTLED_STATES = frozenset({CycleState.RECOVERED, CycleState.CLOSED_VOID})
UNFINISHED_INVOICE_STATUSES = (InvoiceStatus.DRAFT, InvoiceStatus.OPEN, InvoiceStatus.UNCOLLECTIBLE)


class Kind:
    PROVIDER_PAID_NO_LOCAL_FACT = "PROVIDER_PAID_NO_LOCAL_FACT"
    LOCAL_PAID_PROVIDER_NOT_PAID = "LOCAL_PAID_PROVIDER_NOT_PAID"
    PAID_BUT_CYCLE_OPEN = "PAID_BUT_CYCLE_OPEN"
    VOID_BUT_CYCLE_OPEN = "VOID_BUT_CYCLE_OPEN"
    INVOICE_STATUS_DIFFERS = "INVOICE_STATUS_DIFFERS"
    AMOUNT_MISMATCH = "AMOUNT_MISMATCH"
    PROVIDER_INVOICE_NOT_FOUND = "PROVIDER_INVOICE_NOT_FOUND"
    ENTITLEMENT_MISMATCH = "ENTITLEMENT_MISMATCH"
    ROOT_MISMATCH = "ROOT_MISMATCH"
    SNAPSHOT_MISMATCH = "SNAPSHOT_MISMATCH"
    EVENT_MISSING_FROM_INBOX = "EVENT_MISSING_FROM_INBOX"
    FETCH_FAILED = "FETCH_FAILED"
    CHECK_FAILED = "CHECK_FAILED"


def _setting(name: str, default: Any) -> Any:
    return getattr(settings, name, default)


def reconciliation_window(now: datetime) -> tuple[datetime, datetime, datetime | None]:
    """(start, end, end of the previous report's window or None)."""
    start = now - timedelta(hours=float(_setting("DUNNING_RECONCILIATION_WINDOW_HOURS", 24)))
    previous = (ReconciliationReport.objects.filter(window_end__lte=now).order_by("-window_end")
                .values_list("window_end", flat=True).first())
    if previous is not None and previous < start:
        start = previous  # a missed day: reconcile from where the last report stopped...
    floor = now - timedelta(days=float(_setting("DUNNING_RECONCILIATION_MAX_CATCH_UP_DAYS", 7)))
    return max(start, floor), now, previous  # ...but not further back than the cap


class Findings:
    def __init__(self) -> None:
        self.listed: list[dict[str, Any]] = []
        self.by_kind: Counter[str] = Counter()

    def add(self, kind: str, detail: str, **ids: Any) -> dict[str, Any]:
        self.by_kind[kind] += 1
        entry = {"kind": kind, **{k: v for k, v in ids.items() if v not in (None, "")}, "detail": detail}
        if len(self.listed) < MAX_LISTED:
            self.listed.append(entry)
        return entry

    def __len__(self) -> int:
        return sum(self.by_kind.values())


@scheduled_job(JOB, "Daily reconciliation: provider-paid invoices vs local money facts vs entitlements")
def reconciliation(run: JobReport) -> None:
    with claim(JOB, 0) as got:
        if not got:
            run.refused += 1
            run.note("another worker is running the reconciliation; skipped")
            return
        start, end, previous_end = reconciliation_window(run.now)
        findings = Findings()
        totals: dict[str, Any] = {}
        if previous_end is not None and previous_end < start:
            totals["unreconciled_gap"] = [previous_end.isoformat(), start.isoformat()]
            run.note(f"nothing reconciled {previous_end.isoformat()}..{start.isoformat()}: past the catch-up cap")
        provider = get_provider()
        _check_events(run, provider, start, end, findings, totals)
        _check_invoices(run, start, findings, totals)
        _check_subscriptions(run, start, findings, totals)
        totals["discrepancies"] = len(findings)
        totals["by_kind"] = dict(sorted(findings.by_kind.items()))
        totals["discrepancies_listed"] = len(findings.listed)
        report = ReconciliationReport.objects.create(run_for=run.now, window_start=start, window_end=end,
                                                     created_at=run.now, totals=totals,
                                                     discrepancies=findings.listed)
        run.note(f"report {report.pk} for {start.isoformat()}..{end.isoformat()}: {len(findings)} discrepancies"
                 + (f" ({', '.join(f'{n} {k}' for k, n in totals['by_kind'].items())})" if findings else ""))
        if findings:
            summary = ", ".join(f"{n} × {k}" for k, n in totals["by_kind"].items())
            alert_raise(
                kind=AlertKind.RECONCILIATION_MISMATCH, dedupe_key=f"reconciliation:{report.pk}",
                detail=(f"Reconciliation of {start:%Y-%m-%d %H:%M}–{end:%Y-%m-%d %H:%M} UTC found {len(findings)} "
                        f"discrepancies: {summary}. See reconciliation report {report.pk}."),
                figures={"report": report.pk, "window_start": start.isoformat(), "window_end": end.isoformat(),
                         "by_kind": totals["by_kind"]},
                now=run.now,
            )


# --------------------------------------------------------------------------- provider events


def _check_events(run: JobReport, provider: PaymentProvider, start: datetime, end: datetime, findings: Findings,
                  totals: dict[str, Any]) -> None:
    grace = timedelta(seconds=float(_setting("DUNNING_RECONCILIATION_EVENT_GRACE_SECONDS", 300)))
    prefixes = tuple(_setting("DUNNING_RECONCILIATION_EVENT_PREFIXES", DEFAULT_EVENT_PREFIXES))
    try:
        events = provider.list_events_since(created_after=start, max_events=EVENT_PAGE)
    except ProviderError as exc:
        run.errors += 1
        findings.add(Kind.FETCH_FAILED, f"Could not list the provider's events since {start.isoformat()}: {exc}",
                     object="events")
        totals["events_listed"] = None
        return
    totals["events_listed"] = len(events)
    if len(events) >= EVENT_PAGE:
        # More events than one run checks: the oldest of the window went unchecked.
        oldest = min(int(e.get("created") or 0) for e in events)
        totals["events_listing_truncated"] = True
        totals["events_unchecked_before"] = datetime.fromtimestamp(oldest, tz=UTC).isoformat()
        run.note(f"provider event listing truncated at {EVENT_PAGE}; events before "
                 f"{totals['events_unchecked_before']} were not checked against the inbox")
    checked: dict[str, dict[str, Any]] = {}
    for event in events:
        created = datetime.fromtimestamp(int(event.get("created") or 0), tz=UTC)
        if not (start < created <= end - grace) or not str(event.get("type", "")).startswith(prefixes):
            continue
        checked[str(event["id"])] = event
    known = set(ProviderEvent.objects.filter(provider=provider.name, event_id__in=list(checked))
                .values_list("event_id", flat=True))
    totals["events_checked"] = len(checked)
    totals["events_missing"] = 0
    for event_id, event in checked.items():
        run.examined += 1
        run.tick()
        if event_id in known:
            continue
        totals["events_missing"] += 1
        obj = (event.get("data") or {}).get("object") or {}
        created = datetime.fromtimestamp(int(event["created"]), tz=UTC)
        findings.add(
            Kind.EVENT_MISSING_FROM_INBOX,
            f"The provider sent {event.get('type')} {event_id} for {obj.get('object', 'object')} {obj.get('id')} at "
            f"{created:%Y-%m-%d %H:%M:%S} UTC, and it never reached our inbox (a lost webhook).",
            event_id=event_id, event_type=event.get("type"), object_id=obj.get("id"), created=created.isoformat(),
        )


# --------------------------------------------------------------------------- invoices


def invoices_to_reconcile(start: datetime) -> QuerySet:
    return Invoice.objects.filter(
        Q(updated_at__gte=start) | Q(cycle__state__in=OPEN_STATES)
        | Q(cycle__isnull=True, status__in=UNFINISHED_INVOICE_STATUSES)
    )


def _pages(queryset: QuerySet, size: int = BATCH):  # noqa: ANN202 - an iterator of lists of rows
    """Rows in primary-key order, one keyset page at a time."""
    last = 0
    while True:
        page = list(queryset.filter(pk__gt=last).order_by("pk")[:size])
        if not page:
            return
        yield page
        last = page[-1].pk


def _check_invoices(run: JobReport, start: datetime, findings: Findings, totals: dict[str, Any]) -> None:
    counts = Counter()
    providers: dict[str, PaymentProvider] = {}
    queryset = invoices_to_reconcile(start).select_related("cycle", "subscription")
    for page in _pages(queryset):
        paid_facts = set(MonetaryFact.objects.filter(invoice__in=page, kind=FactKind.PAYMENT_SUCCEEDED)
                         .values_list("invoice_id", flat=True))
        for invoice in page:
            run.examined += 1
            run.tick()
            counts["invoices_examined"] += 1
            ids = _invoice_ids(invoice)
            try:
                provider = providers.get(invoice.provider) or providers.setdefault(invoice.provider,
                                                                                   get_provider(invoice.provider))
                remote = provider.fetch_invoice(invoice.provider_invoice_id)
            except ProviderNotFound as exc:
                findings.add(Kind.PROVIDER_INVOICE_NOT_FOUND,
                             f"Invoice {invoice.provider_invoice_id} is mirrored locally ({invoice.status}) but the "
                             f"provider has no such invoice: {exc}", **ids)
                continue
            except (ProviderError, LookupError) as exc:
                run.errors += 1
                counts["fetch_failures"] += 1
                findings.add(Kind.FETCH_FAILED, f"Could not fetch invoice {invoice.provider_invoice_id} from the "
                                                f"provider ({type(exc).__name__}: {exc}); it was not reconciled.",
                             **ids)
                continue
            try:
                if remote.status == "paid":
                    counts["invoices_paid_at_provider"] += 1
                _compare_invoice(run, invoice, remote, invoice.pk in paid_facts, findings, ids)
            except Exception as exc:  # a bad row must not end the run
                log.exception("reconciliation: invoice %s", invoice.provider_invoice_id)
                run.errors += 1
                findings.add(Kind.CHECK_FAILED, f"Comparing invoice {invoice.provider_invoice_id} failed: "
                                                f"{type(exc).__name__}: {exc}", **ids)
    totals.update({k: counts[k] for k in ("invoices_examined", "invoices_paid_at_provider", "fetch_failures")})


def _cycle_of(invoice: Invoice) -> DunningCycle | None:
    try:
        return invoice.cycle
    except DunningCycle.DoesNotExist:
        return None


def _invoice_ids(invoice: Invoice) -> dict[str, Any]:
    cycle = _cycle_of(invoice)
    return {"invoice": invoice.pk, "provider_invoice_id": invoice.provider_invoice_id,
            "subscription": invoice.subscription_id,
            "provider_subscription_id": invoice.subscription.provider_subscription_id,
            "cycle": str(cycle.cycle_id) if cycle else None, "cycle_state": cycle.state if cycle else None}


def _compare_invoice(run: JobReport, invoice: Invoice, remote: ProviderInvoice, has_paid_fact: bool,
                     findings: Findings, ids: dict[str, Any]) -> None:
    cycle = _cycle_of(invoice)
    name = invoice.provider_invoice_id
    state = cycle.state if cycle else "no cycle"
    found: list[tuple[str, str]] = []
    if remote.status == "paid":
        if not has_paid_fact:
            found.append((Kind.PROVIDER_PAID_NO_LOCAL_FACT,
                          f"The provider shows invoice {name} paid ({remote.amount_paid} {remote.currency.upper()}), "
                          f"but we hold no PAYMENT_SUCCEEDED fact for it (local mirror: {invoice.status})."))
        if cycle is not None and cycle.state not in SETTLED_STATES and not cycle.dispute_reopened:
            found.append((Kind.PAID_BUT_CYCLE_OPEN,
                          f"The provider shows invoice {name} paid, but its dunning cycle is still {cycle.state}."))
    else:
        local_paid = has_paid_fact or invoice.status == InvoiceStatus.PAID or state == CycleState.RECOVERED
        if local_paid:
            found.append((Kind.LOCAL_PAID_PROVIDER_NOT_PAID,
                          f"We treat invoice {name} as paid (cycle {state}, mirror {invoice.status}, "
                          f"{'a' if has_paid_fact else 'no'} PAYMENT_SUCCEEDED fact), but the provider shows it "
                          f"{remote.status}."))
        if remote.status == "void" and cycle is not None and cycle.state in OPEN_STATES:
            found.append((Kind.VOID_BUT_CYCLE_OPEN,
                          f"The provider shows invoice {name} void, but its dunning cycle is still {cycle.state}."))
    if not found and remote.status != invoice.status:
        found.append((Kind.INVOICE_STATUS_DIFFERS,
                      f"The provider shows invoice {name} {remote.status}; our mirror says {invoice.status}."))
    if remote.amount_due != invoice.amount_due or remote.currency != invoice.currency.lower():
        found.append((Kind.AMOUNT_MISMATCH,
                      f"The provider bills invoice {name} at {remote.amount_due} {remote.currency.upper()}; our "
                      f"mirror says {invoice.amount_due} {invoice.currency.upper()}."))
    if not found:
        return
    receipt = None
    if remote.raw:  # the fresh fetch the discrepancy cites
        # fetched_at is when the fetch really happened (the trusted clock), as for every receipt.
        receipt = receipt_record(object_type="invoice", body=remote.raw, invoice=invoice, account=remote.account,
                                 provider=invoice.provider)
    for kind, detail in found:
        findings.add(kind, detail, **ids, provider_status=remote.status, local_status=invoice.status,
                     receipt=receipt.pk if receipt else None)


# --------------------------------------------------------------------------- subscriptions


def subscriptions_to_reconcile(start: datetime) -> QuerySet:
    delinquent = DunningCycle.objects.filter(subscription=OuterRef("pk"), state__in=DELINQUENT_STATES)
    latest = EntitlementSnapshot.objects.filter(subscription=OuterRef("pk")).order_by("-generation")
    return (Subscription.objects.filter(
        ~Q(outstanding_cycle_root=EMPTY_ROOT) | ~Q(entitlement_profile=FULL) | Q(updated_at__gte=start)
        | Exists(delinquent))
        .annotate(snapshot_generation=Subquery(latest.values("generation")[:1]),
                  snapshot_profile=Subquery(latest.values("profile")[:1]))
        .select_related("policy"))


def _check_subscriptions(run: JobReport, start: datetime, findings: Findings, totals: dict[str, Any]) -> None:
    examined = 0
    for page in _pages(subscriptions_to_reconcile(start)):
        for subscription in page:
            run.examined += 1
            run.tick()
            examined += 1
            try:
                _compare_subscription(subscription, findings)
            except Exception as exc:
                log.exception("reconciliation: subscription %s", subscription.pk)
                run.errors += 1
                findings.add(Kind.CHECK_FAILED, f"Recomputing subscription {subscription.provider_subscription_id} "
                                                f"failed: {type(exc).__name__}: {exc}", subscription=subscription.pk)
    totals["subscriptions_examined"] = examined


def _compare_subscription(subscription: Subscription, findings: Findings) -> None:
    ids = {"subscription": subscription.pk, "provider_subscription_id": subscription.provider_subscription_id}
    name = subscription.provider_subscription_id
    root, decision = compute_aggregate(subscription, None)
    if root != subscription.outstanding_cycle_root:
        findings.add(Kind.ROOT_MISMATCH,
                     f"Subscription {name} stores outstanding-cycle root {subscription.outstanding_cycle_root[:12]}…, "
                     f"but its blocking cycles recompute to {root[:12]}… ({decision.blocking_count} blocking).",
                     **ids, stored_root=subscription.outstanding_cycle_root, recomputed_root=root)
    spec = policy_spec(subscription.policy)
    enforced = enforces_access(spec, subscription_key=name, cohort=subscription.cohort)
    if enforced and decision.profile != subscription.entitlement_profile:
        findings.add(Kind.ENTITLEMENT_MISMATCH,
                     f"Subscription {name} holds {subscription.entitlement_profile} (generation "
                     f"{subscription.entitlement_generation}), but its cycles call for {decision.profile} "
                     f"({decision.reason}).",
                     **ids, stored_profile=subscription.entitlement_profile, recomputed_profile=decision.profile,
                     generation=subscription.entitlement_generation)
    snapshot = (subscription.snapshot_generation, subscription.snapshot_profile)
    if snapshot != (subscription.entitlement_generation, subscription.entitlement_profile):
        shown = f"generation {snapshot[0]} ({snapshot[1]})" if snapshot[0] is not None else "no snapshot"
        findings.add(Kind.SNAPSHOT_MISMATCH,
                     f"Subscription {name} holds {subscription.entitlement_profile} at generation "
                     f"{subscription.entitlement_generation}, but its latest issued snapshot is {shown}.",
                     **ids, snapshot_generation=snapshot[0], snapshot_profile=snapshot[1])
