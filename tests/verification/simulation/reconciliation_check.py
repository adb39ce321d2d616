"""Does the reconciliation tell the truth? Each stored ReconciliationReport is compared, both
ways, with the simulator's ledger as it stood when the report was made:

- every finding names a real difference between the provider (the simulator's objects and
  ledger, read as of the report's `run_for`) and our books as of the same instant (facts
  recorded by then, the invoice mirror and the cycle as their history shows them, the inbox);
- every real difference the window covers is found: on every invoice touched in the window
  (a provider change, an event naming it, or a local change) or still open, and every event the
  provider created in the (grace-shifted) window that had not reached the inbox.

Accepted either way (in flight, SPEC §8 / reconciliation docstring): an invoice the provider
changed, or sent an event about, within the grace before the run; an invoice the report lists
as read stale (the provider kept answering from an old copy).

Called by the auditor after each step with the pk of the newest report already checked (set
to `newest_report_pk()` when the auditor is made, so reports of earlier runs are not judged
against this run's simulator):

    found = check_reports(self.s, since=self.last_report_pk) + check_mirrors(self.s, self.mirrors)
    self.last_report_pk = newest_report_pk(self.last_report_pk)
    for code, detail in found:
        self.report(code, detail)

`check_mirrors` is the auditor's own view of what the reconciliation found every day on seed 3:
an invoice mirror that went back to an earlier status (a stale read taken for the truth).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Max

from dunning.models import DunningCycle, FactKind, MonetaryFact, ProviderEvent, ReconciliationReport
from dunning.states import OPEN_STATES, SETTLED_STATES
from subscriptions.models import Invoice
from tests.verification.simulation.world import SimulatedWorld

FALSE_FINDING = "RECONCILIATION_FALSE_FINDING"
MISSED_DIFFERENCE = "RECONCILIATION_MISSED_DIFFERENCE"
LOCAL_INCONSISTENCY = "RECONCILIATION_LOCAL_INCONSISTENCY"
MIRROR_WENT_BACK = "MIRROR_WENT_BACK"
CODES = (FALSE_FINDING, MISSED_DIFFERENCE, LOCAL_INCONSISTENCY, MIRROR_WENT_BACK)

STATUS_KINDS = frozenset({"PROVIDER_PAID_NO_LOCAL_FACT", "LOCAL_PAID_PROVIDER_NOT_PAID", "PAID_BUT_CYCLE_OPEN",
                          "VOID_BUT_CYCLE_OPEN", "INVOICE_STATUS_DIFFERS"})
PAID_PRESENCE = frozenset({"PROVIDER_PAID_NO_LOCAL_FACT", "LOCAL_PAID_PROVIDER_NOT_PAID"})
# Findings about our own rows agreeing with each other: never a ledger difference; in a
# simulation either the product or the reconciliation is wrong, so each one is reported.
LOCAL_KINDS = frozenset({"ROOT_MISMATCH", "ENTITLEMENT_MISMATCH", "SNAPSHOT_MISMATCH", "CHECK_FAILED",
                         "FETCH_FAILED", "PROVIDER_INVOICE_NOT_FOUND"})
OPEN_TERMINAL = SETTLED_STATES | {"CANCELED"}
RANK = {"draft": 0, "open": 1, "uncollectible": 2, "paid": 3, "void": 3}


def newest_report_pk(since: int = 0) -> int:
    return max(since, ReconciliationReport.objects.aggregate(m=Max("pk"))["m"] or 0)


def check_reports(simulation: SimulatedWorld, since: int) -> list[tuple[str, str]]:
    """(code, detail) for each untrue or missing finding of the reports stored after pk `since`."""
    found: list[tuple[str, str]] = []
    for report in ReconciliationReport.objects.filter(pk__gt=since).order_by("pk"):
        found += _check_report(simulation, report)
    return found


# --------------------------------------------------------------------------- the two sides at T


@dataclass
class Truth:
    """One invoice as the simulator held it at T."""

    id: str
    status: str
    amount_due: int
    paid: int
    refunded: int
    withdrawn: int
    reinstated: int
    disputed_refs: set[str]  # charge and payment intent of each charge disputed by T
    moved_at: list[int]  # every provider change of the invoice, its charges, refunds and disputes
    refs: set[str] = field(default_factory=set)  # its charges, payment intent and disputes


@dataclass
class Books:
    """One invoice as our rows stood at T."""

    mirror_status: str | None
    mirror_amount_due: int | None
    cycle_state: str | None
    dispute_reopened: bool
    paid: int
    has_paid_fact: bool
    refunded: int
    withdrawn: int
    reinstated: int
    dispute_refs: set[str]
    touched_at: list[datetime]


def _status_at(inv: dict[str, Any], ts: float) -> str | None:
    if inv["created"] > ts:
        return None
    marks = inv.get("status_transitions") or {}
    steps = [(marks.get(name), status) for name, status in (("finalized_at", "open"),
                                                            ("marked_uncollectible_at", "uncollectible"),
                                                            ("paid_at", "paid"), ("voided_at", "void"))]
    reached = [(at, status) for at, status in steps if at is not None and at <= ts]
    return max(reached, key=lambda pair: (pair[0], RANK[pair[1]]))[1] if reached else "draft"


def _provider_truth(simulation: SimulatedWorld, ts: float) -> dict[str, Truth]:
    sim = simulation.sim
    with sim.lock:
        store = sim.store
        invoices = [dict(i) for i in store.all_of("invoice") if i["subscription"] in simulation.subscriptions]
        charges = [dict(c) for c in store.all_of("charge")]
        refunds = [dict(r) for r in store.all_of("refund")]
        disputes = [dict(d, balance_transactions=list(d.get("balance_transactions") or []))
                    for d in store.all_of("dispute")]
    truth: dict[str, Truth] = {}
    for inv in invoices:
        status = _status_at(inv, ts)
        if status is None:
            continue
        marks = [t for t in (inv.get("status_transitions") or {}).values() if t is not None]
        truth[inv["id"]] = Truth(inv["id"], status, inv["amount_due"], inv["amount_paid"] if status == "paid" else 0,
                                 0, 0, 0, set(), [inv["created"], *marks], {inv["payment_intent"] or ""} - {""})
    for ch in charges:
        t = truth.get(ch.get("invoice") or "")
        if t is None or ch["created"] > ts:
            continue
        t.refs |= {ch["id"], ch["payment_intent"]}
        t.moved_at.append(ch["created"])
    by_charge = {ch["id"]: ch.get("invoice") for ch in charges}
    for re in refunds:
        t = truth.get(by_charge.get(re["charge"]) or "")
        if t is not None and re["created"] <= ts:
            t.refunded += re["amount"]
            t.moved_at.append(re["created"])
    for dp in disputes:
        t = truth.get(by_charge.get(dp["charge"]) or "")
        if t is None or dp["created"] > ts:
            continue
        t.disputed_refs |= {dp["charge"], dp["payment_intent"]}
        t.refs.add(dp["id"])
        t.moved_at.append(dp["created"])
        for movement in dp["balance_transactions"]:
            if movement["created"] <= ts:
                t.withdrawn += -movement["amount"] if movement["amount"] < 0 else 0
                t.reinstated += movement["amount"] if movement["amount"] > 0 else 0
                t.moved_at.append(movement["created"])
    return truth


def _books(invoice_ids: Iterable[str], at: datetime) -> dict[str, Books]:
    pks = dict(Invoice.objects.filter(provider_invoice_id__in=list(invoice_ids))
               .values_list("pk", "provider_invoice_id"))
    mirrors: dict[int, dict[str, Any]] = {}
    for row in (Invoice.history.model.objects.filter(id__in=list(pks), history_date__lte=at)
                .order_by("id", "history_date", "history_id").values("id", "status", "amount_due", "history_date")):
        mirrors[row["id"]] = row  # the last one as of `at` wins
    cycles: dict[int, dict[str, Any]] = {}
    for row in (DunningCycle.history.model.objects.filter(invoice_id__in=list(pks), history_date__lte=at)
                .order_by("invoice_id", "history_date", "history_id")
                .values("invoice_id", "state", "dispute_reopened", "history_date")):
        cycles[row["invoice_id"]] = row
    books: dict[str, Books] = {}
    for pk, provider_id in pks.items():
        mirror, cycle = mirrors.get(pk), cycles.get(pk)
        books[provider_id] = Books(
            mirror["status"] if mirror else None, mirror["amount_due"] if mirror else None,
            cycle["state"] if cycle else None, bool(cycle and cycle["dispute_reopened"]), 0, False, 0, 0, 0, set(),
            [row["history_date"] for row in (mirror, cycle) if row])
    legacy: dict[tuple[str, str], int] = {}
    for invoice_pk, kind, amount, cumulative, ref, recorded_at in (
            MonetaryFact.objects.filter(invoice_id__in=list(pks), recorded_at__lte=at)
            .values_list("invoice_id", "kind", "amount", "cumulative_amount", "provider_ref", "recorded_at")):
        b = books[pks[invoice_pk]]
        b.touched_at.append(recorded_at)
        if kind == FactKind.PAYMENT_SUCCEEDED:
            b.paid += amount
            b.has_paid_fact = True
        elif kind == FactKind.REFUNDED and cumulative is None:  # written before increments: a cumulative total
            key = (pks[invoice_pk], ref)
            b.refunded += max(0, amount - legacy.get(key, 0))
            legacy[key] = max(amount, legacy.get(key, 0))
        elif kind == FactKind.REFUNDED:
            b.refunded += amount
        elif kind.startswith("DISPUTE_"):
            b.dispute_refs.add(ref)
            b.withdrawn += amount if kind == FactKind.DISPUTE_FUNDS_WITHDRAWN else 0
            b.reinstated += amount if kind == FactKind.DISPUTE_FUNDS_REINSTATED else 0
    return books


def _differences(t: Truth, b: Books) -> dict[str, str]:
    """The differences the reconciliation has a finding for: kind → what differs."""
    diff: dict[str, str] = {}
    local_paid = b.has_paid_fact or b.mirror_status == "paid" or b.cycle_state == "RECOVERED"
    if t.status == "paid":
        if not b.has_paid_fact:
            diff["PROVIDER_PAID_NO_LOCAL_FACT"] = "provider paid, no PAYMENT_SUCCEEDED fact"
        if b.cycle_state is not None and b.cycle_state not in SETTLED_STATES and not b.dispute_reopened:
            diff["PAID_BUT_CYCLE_OPEN"] = f"provider paid, cycle {b.cycle_state}"
    elif local_paid:
        diff["LOCAL_PAID_PROVIDER_NOT_PAID"] = f"provider {t.status}, we hold it paid"
    if t.status == "void" and b.cycle_state is not None and b.cycle_state not in OPEN_TERMINAL:
        diff["VOID_BUT_CYCLE_OPEN"] = f"provider void, cycle {b.cycle_state}"
    if b.mirror_status != t.status:
        diff["INVOICE_STATUS_DIFFERS"] = f"provider {t.status}, mirror {b.mirror_status}"
    if b.mirror_amount_due is not None and b.mirror_amount_due != t.amount_due:
        diff["AMOUNT_MISMATCH"] = f"provider bills {t.amount_due}, mirror {b.mirror_amount_due}"
    if t.paid - t.refunded != b.paid - b.refunded:
        diff["NET_PAID_DIFFERS"] = (f"provider paid {t.paid} refunded {t.refunded}; facts paid {b.paid} "
                                    f"refunded {b.refunded}")
    if t.withdrawn - t.reinstated != b.withdrawn - b.reinstated:
        diff["DISPUTE_FUNDS_DIFFER"] = (f"provider withdrew {t.withdrawn} reinstated {t.reinstated}; facts "
                                        f"{b.withdrawn} / {b.reinstated}")
    if t.disputed_refs and not t.disputed_refs & b.dispute_refs:
        diff["DISPUTE_NOT_RECORDED"] = "provider shows the charge disputed, no dispute fact"
    return diff


def _covered(kind: str, kinds: set[str]) -> bool:
    """Is a difference of `kind` reported by one of the findings `kinds` of its invoice? The
    reconciliation names a status difference once (INVOICE_STATUS_DIFFERS only when no other
    status finding explains it) and a net-paid difference through a paid-presence finding."""
    if kind in kinds:
        return True
    if kind == "INVOICE_STATUS_DIFFERS":
        return bool(kinds & STATUS_KINDS)
    if kind == "NET_PAID_DIFFERS":
        return bool(kinds & PAID_PRESENCE)
    if kind == "DISPUTE_FUNDS_DIFFER":
        return "DISPUTE_NOT_RECORDED" in kinds
    return False


# --------------------------------------------------------------------------- one report


def _check_report(simulation: SimulatedWorld, report: ReconciliationReport) -> list[tuple[str, str]]:
    at = report.run_for
    ts = at.timestamp()
    grace = timedelta(seconds=float(getattr(settings, "DUNNING_RECONCILIATION_EVENT_GRACE_SECONDS", 300)))
    settle_after = (at - grace).timestamp()
    start = report.window_start
    label = f"report {report.pk} ({start:%Y-%m-%d %H:%M}–{at:%Y-%m-%d %H:%M})"
    out: list[tuple[str, str]] = []

    truth = _provider_truth(simulation, ts)
    books = _books(truth, at)
    with simulation.sim.lock:
        events = [dict(e) for e in simulation.sim.store.events]
    named_recently: set[str] = set()
    named_in_window: set[str] = set()
    for event in events:
        obj = (event.get("data") or {}).get("object") or {}
        names = {obj.get("id"), obj.get("invoice"), obj.get("charge"), obj.get("payment_intent")} - {None, ""}
        if settle_after < event["created"] <= ts:
            named_recently |= {n for n in names if isinstance(n, str)}
        if (start - grace).timestamp() < event["created"] <= ts:
            named_in_window |= {n for n in names if isinstance(n, str)}

    def moving(t: Truth) -> bool:
        return (any(settle_after < m <= ts for m in t.moved_at)
                or bool(({t.id} | t.refs) & named_recently))

    stale = set(report.totals.get("read_stale") or [])
    findings: dict[str, set[str]] = {}
    for entry in report.discrepancies:
        kind = entry["kind"]
        invoice_id = entry.get("provider_invoice_id") or ""
        if kind in LOCAL_KINDS:
            out.append((LOCAL_INCONSISTENCY, f"{label}: {kind} {invoice_id or entry.get('provider_subscription_id')}"
                                             f": {entry['detail']}"))
            continue
        if kind == "EVENT_MISSING_FROM_INBOX":
            continue  # below, with the events
        findings.setdefault(invoice_id, set()).add(kind)
        t, b = truth.get(invoice_id), books.get(invoice_id)
        if t is None or b is None:
            out.append((FALSE_FINDING, f"{label}: {kind} on {invoice_id}, which the simulator did not hold then"))
            continue
        if moving(t):
            continue  # in flight: a finding is early, not false
        real = _differences(t, b)
        if kind not in real:
            out.append((FALSE_FINDING, f"{label}: {kind} on {invoice_id}, but the ledger then showed "
                                       f"{t.status} (paid {t.paid}, refunded {t.refunded}, disputes "
                                       f"{t.withdrawn}/{t.reinstated}) and our books {b.mirror_status} / cycle "
                                       f"{b.cycle_state} (facts paid {b.paid}, refunded {b.refunded}, disputes "
                                       f"{b.withdrawn}/{b.reinstated}): {entry['detail']}"))

    for invoice_id, t in truth.items():
        b = books.get(invoice_id)
        if b is None or moving(t) or invoice_id in stale:
            continue
        touched = (any(start.timestamp() <= m <= ts for m in t.moved_at) or any(start <= d <= at for d in b.touched_at)
                   or bool(({invoice_id} | t.refs) & named_in_window))
        still_open = (b.cycle_state in OPEN_STATES
                      or (b.cycle_state is None and b.mirror_status in ("draft", "open", "uncollectible")))
        if not (touched or still_open):
            continue
        kinds = findings.get(invoice_id, set())
        for kind, what in _differences(t, b).items():
            if not _covered(kind, kinds):
                out.append((MISSED_DIFFERENCE, f"{label}: {invoice_id} {what} ({kind} not reported)"))

    prefixes = tuple(getattr(settings, "DUNNING_RECONCILIATION_EVENT_PREFIXES",
                             ("invoice.", "payment_intent.", "charge.", "customer.subscription.")))
    since, until = (start - grace).timestamp(), (at - grace).timestamp()
    expected = {e["id"] for e in events if since < e["created"] <= until and e["type"].startswith(prefixes)}
    received = set(ProviderEvent.objects.filter(event_id__in=[e["id"] for e in events], received_at__lte=at)
                   .values_list("event_id", flat=True))
    reported = {d.get("event_id") for d in report.discrepancies if d["kind"] == "EVENT_MISSING_FROM_INBOX"}
    by_id = {e["id"]: e for e in events}
    for event_id in sorted(reported):
        event = by_id.get(event_id)
        if event is None or event["created"] > ts or event_id in received:
            out.append((FALSE_FINDING, f"{label}: EVENT_MISSING_FROM_INBOX {event_id}, but "
                                       f"{'the provider never sent it' if event is None else 'it was in our inbox'}"))
    for event_id in sorted(expected - received - reported):
        event = by_id[event_id]
        out.append((MISSED_DIFFERENCE, f"{label}: {event['type']} {event_id} (created {event['created']}) had not "
                                       f"reached the inbox (EVENT_MISSING_FROM_INBOX not reported)"))
    return out


@dataclass
class MirrorWatch:
    """What `check_mirrors` has read of the invoice mirrors' history so far (it reads only the
    rows added since, so a check after every step stays cheap on a long run)."""

    last_history_id: int = 0
    furthest: dict[int, str] = field(default_factory=dict)  # invoice pk -> furthest status it held
    current: dict[int, tuple[str, str]] = field(default_factory=dict)  # invoice pk -> (provider id, status)


def check_mirrors(simulation: SimulatedWorld, watch: MirrorWatch | None = None) -> list[tuple[str, str]]:
    """(MIRROR_WENT_BACK, detail) for each invoice mirror of the run that shows an earlier status
    than one it already held: a provider invoice never goes back (draft → open → uncollectible →
    paid / void), so the product took a stale read for the truth. The auditor missed exactly this
    on seed 3 (3,000 steps): a lost dispute's event read an old copy of a paid invoice and moved
    the mirror back to open for good; only the reconciliation noticed, every day."""
    watch = watch if watch is not None else MirrorWatch()
    rows = (Invoice.history.model.objects.filter(subscription__provider_subscription_id__in=simulation.subscriptions,
                                                 history_id__gt=watch.last_history_id)
            .order_by("history_id").values_list("history_id", "id", "provider_invoice_id", "status"))
    for history_id, pk, provider_id, status in rows:
        if RANK.get(status, 0) > RANK.get(watch.furthest.get(pk, "draft"), 0):
            watch.furthest[pk] = status
        watch.current[pk] = (provider_id, status)
        watch.last_history_id = max(watch.last_history_id, history_id)
    return [(MIRROR_WENT_BACK, f"invoice {provider_id}: the mirror says {status} after it held {watch.furthest[pk]}")
            for pk, (provider_id, status) in watch.current.items()
            if RANK.get(status, 0) < RANK.get(watch.furthest.get(pk, "draft"), 0)]


def ledger_snapshot(simulation: SimulatedWorld, at: datetime) -> dict[str, Truth]:
    """The provider side as of `at` (for tests and for reading a failing report by hand)."""
    return _provider_truth(simulation, at.timestamp())
