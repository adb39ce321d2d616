"""The daily `reconciliation` job (SPEC §10, §15): what the provider says was paid, against our
money facts and cycle states, against the entitlement each subscription holds.

It only reports. It never moves a cycle, writes a fact or issues a snapshot; what it stores is
one ReconciliationReport, a ProviderReceipt for each invoice it found in disagreement (the fresh
fetch it cites), and one RECONCILIATION_MISMATCH alert when anything disagreed.

Window: the DUNNING_RECONCILIATION_WINDOW_HOURS (24) hours before `run.now`, reaching back to the
end of the last stored report's window when a day was missed, but never more than
DUNNING_RECONCILIATION_MAX_CATCH_UP_DAYS (7) days.

Checks:
- events: the provider's events of the types the product consumes
  (DUNNING_RECONCILIATION_EVENT_PREFIXES) created in the window, shifted back by
  DUNNING_RECONCILIATION_EVENT_GRACE_SECONDS (300 s: deliveries in flight are not counted yet, and
  are counted by the next run, so no event falls between two runs), that are not in the inbox
  → EVENT_MISSING_FROM_INBOX (a lost webhook).
- invoices: every local invoice whose mirror or cycle changed since the window start, whose
  cycle is open (not RECOVERED, CLOSED_VOID or CANCELED), that has no cycle and is not final,
  that gained a money fact since the window start, or that a provider event of the (shifted)
  window names, is fetched from the provider and compared with its money facts, its mirror and
  its cycle state:
  status (paid / void against facts, mirror and cycle), and the money: paid − refunded against
  the invoice's payments and their charges, dispute funds withdrawn − reinstated against the
  balance transactions of its disputes (NET_PAID_DIFFERS, DISPUTE_FUNDS_DIFFER,
  DISPUTE_NOT_RECORDED).

  Two things are not differences and are not reported as such:
  - a stale read: an invoice's status only moves forward (draft → open → uncollectible → paid or
    void, and paid and void are final), so a read showing an earlier status than a receipt we
    already hold is the provider answering from an old copy. It is read again (up to
    STALE_REREADS times); still stale, the invoice is counted as not reconciled this run
    (totals: stale_reads, invoices_read_stale), never compared on the old copy.
  - a change in flight: when the provider sent an event about the invoice, its payments or
    disputes within the grace before the run, or its status moved then, the comparisons that
    event's processing would settle are left to the next run (totals: invoices_settling).
- subscriptions: every subscription that could hold debt or a restriction (root not the empty
  root, profile not FULL, a cycle in a delinquent state, or updated since the window start):
  stored root and profile against `compute_aggregate`, and against its latest snapshot; a
  contract date that passed within the grace is left to the contract_deadlines job (in flight).
  A subscription outside that set has the empty root, FULL and no delinquent cycle, which is
  exactly what recomputation gives, so nothing is missed by skipping it.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import Exists, OuterRef, Q, QuerySet, Subquery

from dunning.acceptance.aggregate import EMPTY_ROOT
from dunning.acceptance.settlement import compute_aggregate
from dunning.actions.alerts import alert_raise
from dunning.clock import trusted_now
from dunning.evidence.receipts import receipt_record
from dunning.jobs.framework import JobReport, job_setting, one_worker_at_a_time, scheduled_job
from dunning.models import (
    AlertKind,
    DunningCycle,
    FactKind,
    MonetaryFact,
    PaymentAttempt,
    ProviderEvent,
    ProviderReceipt,
    ReconciliationReport,
)
from dunning.policy.cache import policy_spec
from dunning.policy.rollout import enforces_access
from dunning.state_names import invoice_status_rank
from dunning.states import DELINQUENT_STATES, OPEN_STATES, SETTLED_STATES, CycleState
from entitlements.models import EntitlementSnapshot
from entitlements.profiles import FULL
from subscriptions.models import Invoice, InvoiceStatus, Subscription
from subscriptions.providers.base import (
    PaymentProvider,
    ProviderError,
    ProviderInvoice,
    ProviderNotFound,
    ProviderPayment,
)
from subscriptions.providers.registry import all_providers, get_provider

log = logging.getLogger(__name__)
JOB = "reconciliation"
BATCH = 200
MAX_LISTED = 1000  # discrepancies kept in one report; totals count them all
EVENT_PAGE = 10_000  # events checked per run at most (paged from the provider, newest first)
DEFAULT_EVENT_PREFIXES = ("invoice.", "payment_intent.", "charge.", "customer.subscription.")
UNFINISHED_INVOICE_STATUSES = (InvoiceStatus.DRAFT, InvoiceStatus.OPEN, InvoiceStatus.UNCOLLECTIBLE)
STALE_REREADS = 3
DISPUTE_FACT_KINDS = (FactKind.DISPUTE_OPENED, FactKind.DISPUTE_WON, FactKind.DISPUTE_LOST,
                      FactKind.DISPUTE_FUNDS_WITHDRAWN, FactKind.DISPUTE_FUNDS_REINSTATED)


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
    NET_PAID_DIFFERS = "NET_PAID_DIFFERS"
    DISPUTE_FUNDS_DIFFER = "DISPUTE_FUNDS_DIFFER"
    DISPUTE_NOT_RECORDED = "DISPUTE_NOT_RECORDED"
    FETCH_FAILED = "FETCH_FAILED"
    CHECK_FAILED = "CHECK_FAILED"


def _event_grace() -> timedelta:
    """How long a provider event may be in flight before its absence from the inbox counts."""
    return timedelta(seconds=float(job_setting("DUNNING_RECONCILIATION_EVENT_GRACE_SECONDS", 300)))


def reconciliation_window(now: datetime) -> tuple[datetime, datetime, datetime | None]:
    """(start, end, end of the previous report's window or None)."""
    start = now - timedelta(hours=float(job_setting("DUNNING_RECONCILIATION_WINDOW_HOURS", 24)))
    previous = (ReconciliationReport.objects.filter(window_end__lte=now).order_by("-window_end")
                .values_list("window_end", flat=True).first())
    if previous is not None and previous < start:
        start = previous  # a missed day: reconcile from where the last report stopped...
    floor = now - timedelta(days=float(job_setting("DUNNING_RECONCILIATION_MAX_CATCH_UP_DAYS", 7)))
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
@one_worker_at_a_time(JOB, "the reconciliation")
def reconciliation(run: JobReport) -> None:
    start, end, previous_end = reconciliation_window(run.now)
    findings = Findings()
    totals: dict[str, Any] = {}
    if previous_end is not None and previous_end < start:
        totals["unreconciled_gap"] = [previous_end.isoformat(), start.isoformat()]
        run.note(f"nothing reconciled {previous_end.isoformat()}..{start.isoformat()}: past the catch-up cap")
    # Lost webhooks are looked for at the provider that lists its events (Stripe); Alipay lists
    # none, and its daily bill is compared by the alipay_bill job instead.
    provider = next(p for p in all_providers() if p.lists_events)
    grace = _event_grace()
    events = _check_events(run, provider, start, end, findings, totals)
    recent = _Recent.of(events, since=end - grace)
    _check_invoices(run, start, findings, totals, named=_invoices_named_by(events, start - grace), recent=recent)
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
                  totals: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Lost webhooks; returns the events listed (None when the provider could not list them)."""
    grace = _event_grace()
    prefixes = tuple(job_setting("DUNNING_RECONCILIATION_EVENT_PREFIXES", DEFAULT_EVENT_PREFIXES))
    # The window shifted back by the grace: events of the last minutes before `end` are still in
    # flight now, and the next run (whose window starts at or before `end`) counts them.
    since, until = start - grace, end - grace
    try:
        events = provider.list_events_since(created_after=since, max_events=EVENT_PAGE)
    except ProviderError as exc:
        run.errors += 1
        findings.add(Kind.FETCH_FAILED, f"Could not list the provider's events since {since.isoformat()}: {exc}",
                     object="events")
        totals["events_listed"] = None
        return None
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
        if not (since < created <= until) or not str(event.get("type", "")).startswith(prefixes):
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
    return events


# --------------------------------------------------------------------------- invoices


def _event_refs(event: dict[str, Any]) -> tuple[str, set[str]]:
    """(invoice id or "", payment / dispute references) an event's object names."""
    obj = (event.get("data") or {}).get("object") or {}
    kind = obj.get("object")
    if kind == "invoice":
        return str(obj.get("id") or ""), set()
    refs = {obj.get("id"), obj.get("charge"), obj.get("payment_intent")}
    return "", {r if isinstance(r, str) else (r or {}).get("id") for r in refs} - {None, ""}


def _invoices_named_by(events: list[dict[str, Any]] | None, since: datetime) -> set[int]:
    """Local invoices that the provider's events since `since` name: the invoice itself, or a
    payment, refund or dispute of it (through the facts and attempts that recorded its payments)."""
    invoice_ids: set[str] = set()
    refs: set[str] = set()
    for event in events or []:
        if datetime.fromtimestamp(int(event.get("created") or 0), tz=UTC) <= since:
            continue
        invoice_id, named = _event_refs(event)
        if invoice_id:
            invoice_ids.add(invoice_id)
        refs |= named
    pks = set(Invoice.objects.filter(provider_invoice_id__in=invoice_ids).values_list("pk", flat=True))
    if refs:
        pks |= set(MonetaryFact.objects.filter(provider_ref__in=refs).values_list("invoice_id", flat=True))
        pks |= set(PaymentAttempt.objects.filter(provider_payment_ref__in=refs)
                   .values_list("cycle__invoice_id", flat=True))
    return pks


class _Recent:
    """Objects the provider sent an event about within the grace before the run: changes in flight."""

    def __init__(self, ids: set[str], *, since: datetime) -> None:
        self.ids = ids
        self.since = since

    @classmethod
    def of(cls, events: list[dict[str, Any]] | None, *, since: datetime) -> _Recent:
        ids: set[str] = set()
        for event in events or []:
            if datetime.fromtimestamp(int(event.get("created") or 0), tz=UTC) > since:
                invoice_id, refs = _event_refs(event)
                ids |= refs | ({invoice_id} if invoice_id else set())
        return cls(ids, since=since)

    def invoice_moving(self, remote: ProviderInvoice) -> bool:
        transitions = (remote.raw or {}).get("status_transitions") or {}
        moved = [int(t) for t in transitions.values() if t not in (None, "")]
        if moved and datetime.fromtimestamp(max(moved), tz=UTC) > self.since:
            return True
        return remote.id in self.ids or bool(self.ids & set(remote.payment_refs))

    def touches(self, refs: set[str]) -> bool:
        return bool(self.ids & refs)


def invoices_to_reconcile(start: datetime, also: set[int] | frozenset[int] = frozenset()) -> QuerySet:
    recorded = MonetaryFact.objects.filter(invoice_id=OuterRef("pk"), recorded_at__gte=start)
    return Invoice.objects.filter(
        Q(updated_at__gte=start) | Q(cycle__updated_at__gte=start) | Q(cycle__state__in=OPEN_STATES)
        | Q(cycle__isnull=True, status__in=UNFINISHED_INVOICE_STATUSES) | Exists(recorded) | Q(pk__in=list(also))
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


@dataclass
class LocalMoney:
    """An invoice's money as its facts add it up."""

    paid: int = 0
    has_paid_fact: bool = False
    refunded_increments: int = 0
    refunded_before_increments: dict[str, int] = field(default_factory=dict)  # charge → cumulative (old rows)
    withdrawn: int = 0
    reinstated: int = 0
    disputes: set[str] = field(default_factory=set)
    dispute_refs: set[str] = field(default_factory=set)

    @property
    def refunded(self) -> int:
        return self.refunded_increments + sum(self.refunded_before_increments.values())

    @classmethod
    def of_page(cls, invoices: list[Invoice]) -> dict[int, LocalMoney]:
        money: dict[int, LocalMoney] = {invoice.pk: cls() for invoice in invoices}
        rows = (MonetaryFact.objects.filter(invoice__in=invoices)
                .exclude(kind__in=(FactKind.PAYMENT_FAILED, FactKind.INVOICE_VOIDED, FactKind.MARKED_UNCOLLECTIBLE))
                .values_list("invoice_id", "kind", "amount", "cumulative_amount", "provider_ref", "dedupe_key"))
        for invoice_pk, kind, amount, cumulative, ref, key in rows:
            m = money[invoice_pk]
            if kind == FactKind.PAYMENT_SUCCEEDED:
                m.paid += amount
                m.has_paid_fact = True
            elif kind == FactKind.REFUNDED and cumulative is not None:
                m.refunded_increments += amount
            elif kind == FactKind.REFUNDED:  # written before increments: its amount is the cumulative total
                m.refunded_before_increments[ref] = max(amount, m.refunded_before_increments.get(ref, 0))
            elif kind in DISPUTE_FACT_KINDS:
                m.disputes.add(key.split(":")[1])  # dispute_<what>:<dispute id>[:<balance transaction>]
                m.dispute_refs.add(ref)
                if kind == FactKind.DISPUTE_FUNDS_WITHDRAWN:
                    m.withdrawn += amount
                elif kind == FactKind.DISPUTE_FUNDS_REINSTATED:
                    m.reinstated += amount
        return money


class _StaleRead(Exception):
    def __init__(self, remote: ProviderInvoice, held: str) -> None:
        super().__init__(f"read {remote.status} after a receipt showed {held}")
        self.remote = remote
        self.held = held


def _held_statuses(invoices: list[Invoice]) -> dict[str, str]:
    """Per invoice, the furthest status a receipt we hold showed (the provider never goes back)."""
    held: dict[str, str] = {}
    rows = (ProviderReceipt.objects.filter(object_type="invoice",
                                           object_id__in=[i.provider_invoice_id for i in invoices])
            .values_list("object_id", "status").distinct())
    for object_id, status in rows:
        if invoice_status_rank(status, -1) > invoice_status_rank(held.get(object_id, ""), -1):
            held[object_id] = status
    return held


def _fetch_current(provider: PaymentProvider, invoice: Invoice, held: str, counts: Counter) -> ProviderInvoice:
    """The invoice as the provider holds it now, read again while the read is behind what a
    receipt of ours already showed (a stale copy); raises _StaleRead if it stays behind."""
    floor = invoice_status_rank(held, -1)
    for _ in range(1 + STALE_REREADS):
        remote = provider.fetch_invoice(invoice.provider_invoice_id)
        if invoice_status_rank(remote.status) >= floor:
            return remote
        counts["stale_reads"] += 1
    raise _StaleRead(remote, held)


def _check_invoices(run: JobReport, start: datetime, findings: Findings, totals: dict[str, Any], *,
                    named: set[int] | None = None, recent: _Recent | None = None) -> None:
    counts = Counter()
    read_stale: list[str] = []
    providers: dict[str, PaymentProvider] = {}
    recent = recent or _Recent(set(), since=run.now)
    queryset = invoices_to_reconcile(start, frozenset(named or ())).select_related("cycle", "subscription")
    for page in _pages(queryset):
        money = LocalMoney.of_page(page)
        held = _held_statuses(page)
        for invoice in page:
            run.examined += 1
            run.tick()
            counts["invoices_examined"] += 1
            ids = _invoice_ids(invoice)
            try:
                provider = providers.get(invoice.provider) or providers.setdefault(invoice.provider,
                                                                                   get_provider(invoice.provider))
                remote = _fetch_current(provider, invoice, held.get(invoice.provider_invoice_id, ""), counts)
            except _StaleRead as stale:
                counts["invoices_read_stale"] += 1
                read_stale.append(invoice.provider_invoice_id)
                run.note(f"invoice {invoice.provider_invoice_id}: the provider kept answering from an old copy "
                         f"({stale}); not reconciled this run")
                continue
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
                if recent.invoice_moving(remote):
                    counts["invoices_settling"] += 1
                    continue
                found = _compare_invoice(invoice, remote, money[invoice.pk])
                try:
                    found += _compare_money(provider, invoice, remote, money[invoice.pk], recent, found, counts)
                except ProviderError as exc:
                    run.errors += 1
                    counts["fetch_failures"] += 1
                    found.append((Kind.FETCH_FAILED, f"Could not fetch the payments or disputes of invoice "
                                                     f"{invoice.provider_invoice_id} ({type(exc).__name__}: {exc}); "
                                                     f"its money was not reconciled.", {}))
                _record(invoice, remote, found, findings, ids)
            except Exception as exc:  # a bad row must not end the run
                log.exception("reconciliation: invoice %s", invoice.provider_invoice_id)
                run.errors += 1
                findings.add(Kind.CHECK_FAILED, f"Comparing invoice {invoice.provider_invoice_id} failed: "
                                                f"{type(exc).__name__}: {exc}", **ids)
    totals.update({k: counts[k] for k in ("invoices_examined", "invoices_paid_at_provider", "fetch_failures",
                                          "invoices_settling", "stale_reads", "invoices_read_stale")})
    totals["read_stale"] = read_stale[:MAX_LISTED]  # not reconciled this run: the provider answered from old copies


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


Found = tuple[str, str, dict[str, Any]]  # kind, detail, figures


def _compare_invoice(invoice: Invoice, remote: ProviderInvoice, money: LocalMoney) -> list[Found]:
    cycle = _cycle_of(invoice)
    name = invoice.provider_invoice_id
    state = cycle.state if cycle else "no cycle"
    found: list[Found] = []
    if remote.status == "paid":
        if not money.has_paid_fact:
            found.append((Kind.PROVIDER_PAID_NO_LOCAL_FACT,
                          f"The provider shows invoice {name} paid ({remote.amount_paid} {remote.currency.upper()}), "
                          f"but we hold no PAYMENT_SUCCEEDED fact for it (local mirror: {invoice.status}).", {}))
        if cycle is not None and cycle.state not in SETTLED_STATES and not cycle.dispute_reopened:
            found.append((Kind.PAID_BUT_CYCLE_OPEN,
                          f"The provider shows invoice {name} paid, but its dunning cycle is still {cycle.state}.", {}))
    else:
        local_paid = money.has_paid_fact or invoice.status == InvoiceStatus.PAID or state == CycleState.RECOVERED
        if local_paid:
            found.append((Kind.LOCAL_PAID_PROVIDER_NOT_PAID,
                          f"We treat invoice {name} as paid (cycle {state}, mirror {invoice.status}, "
                          f"{'a' if money.has_paid_fact else 'no'} PAYMENT_SUCCEEDED fact), but the provider shows "
                          f"it {remote.status}.", {}))
        if remote.status == "void" and cycle is not None and cycle.state in OPEN_STATES:
            found.append((Kind.VOID_BUT_CYCLE_OPEN,
                          f"The provider shows invoice {name} void, but its dunning cycle is still {cycle.state}.", {}))
    if not found and remote.status != invoice.status:
        found.append((Kind.INVOICE_STATUS_DIFFERS,
                      f"The provider shows invoice {name} {remote.status}; our mirror says {invoice.status}.", {}))
    if remote.amount_due != invoice.amount_due or remote.currency != invoice.currency.lower():
        found.append((Kind.AMOUNT_MISMATCH,
                      f"The provider bills invoice {name} at {remote.amount_due} {remote.currency.upper()}; our "
                      f"mirror says {invoice.amount_due} {invoice.currency.upper()}.", {}))
    return found


def _charges(provider: PaymentProvider, remote: ProviderInvoice) -> list[ProviderPayment]:
    """The invoice's successful charges: each payment intent's latest charge (a payment intent
    charges again only while it has not succeeded), or the charge the invoice names."""
    charges: list[ProviderPayment] = []
    for ref in remote.payment_refs:
        payment = provider.fetch_payment(ref)
        if payment.object == "payment_intent":
            latest = payment.raw.get("latest_charge")
            latest = latest.get("id") if isinstance(latest, dict) else latest
            if not latest:
                continue
            payment = provider.fetch_payment(str(latest))
        if payment.status == "succeeded" and all(c.id != payment.id for c in charges):
            charges.append(payment)
    return charges


def _compare_money(provider: PaymentProvider, invoice: Invoice, remote: ProviderInvoice, money: LocalMoney,
                   recent: _Recent, found: list[Found], counts: Counter) -> list[Found]:
    """Paid − refunded and dispute funds withdrawn − reinstated: our facts' sums against the
    provider's invoice, its charges and its disputes."""
    name = invoice.provider_invoice_id
    if remote.status != "paid" and not (money.has_paid_fact or money.refunded or money.disputes):
        return []  # nothing was paid on either side, so nothing refunded or disputed
    charges = _charges(provider, remote)
    refs = {c.id for c in charges} | {str(c.raw.get("payment_intent") or "") for c in charges}
    refs |= set(remote.payment_refs)
    disputes = [provider.fetch_dispute(d) for d in sorted(money.disputes)]
    if recent.touches(refs | {d.id for d in disputes}):
        counts["invoices_settling"] += 1
        return []
    out: list[Found] = []
    paid_presence = {Kind.PROVIDER_PAID_NO_LOCAL_FACT, Kind.LOCAL_PAID_PROVIDER_NOT_PAID}
    provider_paid = remote.amount_paid if remote.status == "paid" else 0
    provider_refunded = sum(c.amount_refunded for c in charges)
    figures = {"provider_paid": provider_paid, "provider_refunded": provider_refunded,
               "local_paid": money.paid, "local_refunded": money.refunded}
    if (provider_paid - provider_refunded != money.paid - money.refunded
            and not any(kind in paid_presence for kind, _, _ in found)):
        out.append((Kind.NET_PAID_DIFFERS,
                    f"The provider shows {provider_paid} paid and {provider_refunded} refunded on invoice {name} "
                    f"(net {provider_paid - provider_refunded} {remote.currency.upper()}); our facts add up to "
                    f"{money.paid} paid and {money.refunded} refunded (net {money.paid - money.refunded}).",
                    figures))
    withdrawn = reinstated = 0
    for dispute in disputes:
        for movement in dispute.raw.get("balance_transactions") or []:
            amount = int((movement or {}).get("amount") or 0) if isinstance(movement, dict) else 0
            withdrawn += -amount if amount < 0 else 0
            reinstated += amount if amount > 0 else 0
    if withdrawn - reinstated != money.withdrawn - money.reinstated:
        out.append((Kind.DISPUTE_FUNDS_DIFFER,
                    f"The provider's disputes on invoice {name} withdrew {withdrawn} and reinstated {reinstated} "
                    f"(net {withdrawn - reinstated} {remote.currency.upper()}); our facts add up to "
                    f"{money.withdrawn} withdrawn and {money.reinstated} reinstated "
                    f"(net {money.withdrawn - money.reinstated}).",
                    {"provider_withdrawn": withdrawn, "provider_reinstated": reinstated,
                     "local_withdrawn": money.withdrawn, "local_reinstated": money.reinstated,
                     "disputes": sorted(money.disputes)}))
    for charge in charges:
        charge_refs = {charge.id, str(charge.raw.get("payment_intent") or "")} - {""}
        if charge.disputed and not money.dispute_refs & charge_refs:
            out.append((Kind.DISPUTE_NOT_RECORDED,
                        f"The provider shows charge {charge.id} of invoice {name} disputed, but we hold no dispute "
                        f"fact for it.", {"charge": charge.id}))
    return out


def _record(invoice: Invoice, remote: ProviderInvoice, found: list[Found], findings: Findings,
            ids: dict[str, Any]) -> None:
    if not found:
        return
    receipt = None
    if remote.raw:  # the fresh fetch the discrepancy cites
        # fetched_at is when the fetch really happened (the trusted clock), as for every receipt.
        receipt = receipt_record(object_type="invoice", body=remote.raw, invoice=invoice, account=remote.account,
                                 provider=invoice.provider)
    for kind, detail, figures in found:
        findings.add(kind, detail, **ids, provider_status=remote.status, local_status=invoice.status,
                     receipt=receipt.pk if receipt else None, **figures)


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
    clock = trusted_now()
    root, decision = compute_aggregate(subscription, None, clock)
    if root != subscription.outstanding_cycle_root:
        findings.add(Kind.ROOT_MISMATCH,
                     f"Subscription {name} stores outstanding-cycle root {subscription.outstanding_cycle_root[:12]}…, "
                     f"but its blocking cycles recompute to {root[:12]}… ({decision.blocking_count} blocking).",
                     **ids, stored_root=subscription.outstanding_cycle_root, recomputed_root=root)
    spec = policy_spec(subscription.policy)
    enforced = enforces_access(spec, subscription_key=name, cohort=subscription.cohort,
                               subscription_pk=subscription.pk, now=clock)
    if enforced and decision.profile != subscription.entitlement_profile and not _contract_settling(subscription,
                                                                                                   clock):
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


def _contract_settling(subscription: Subscription, now: datetime) -> bool:
    """A date the held contract carries (the period end it cancels at, its end, a pause's resume
    time, a trial's end) passed within the grace before `now`: the contract_deadlines job (every
    minute) applies it, so until then the profile held is the one before that date, in flight."""
    grace = _event_grace()
    dates = (subscription.current_period_end if subscription.cancel_at_period_end else None,
             subscription.contract_ended_at, subscription.pause_resumes_at, subscription.trial_end)
    return any(d is not None and now - grace < d <= now for d in dates)
