"""Invariants checked after every simulation step, against the simulator's ledger as the
monetary truth and against the application's database.

Each check names the rule it guards (SPEC §2, §5–§10, §15). Where a delivery or a fetch was in
flight the auditor accepts the set of outcomes the product could legitimately have reached
(noted at each check). The pure aggregate, contract-phase and rollout functions are bound at
import, so a build that breaks the product's recomputation cannot also break the auditor's.
Deadlines (grace end, a contract's end, the hour a provider cancellation may stay unconfirmed)
are judged against the scheduler's own period, counted only while it was up: an injected outage
or a stretch the engine jumped over moves the deadline to one period after it ended.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import Min

from dunning.acceptance import settlement  # by module: a breakage test patches compute_aggregate
from dunning.acceptance.aggregate import EMPTY_ROOT
from dunning.acceptance.aggregate import aggregate_decision as _pure_decision
from dunning.acceptance.aggregate import outstanding_root as _pure_root
from dunning.acceptance.contract import ContractView
from dunning.acceptance.contract import contract_ceiling as _pure_ceiling
from dunning.acceptance.contract import contract_phase as _pure_phase
from dunning.acceptance.contract import is_ended as _pure_is_ended
from dunning.acceptance.edges import EDGES
from dunning.acceptance.subscription import TIME_GUARDED
from dunning.models import (
    Alert,
    CauseKind,
    EventOutcome,
    FactKind,
    MonetaryFact,
    PaymentAttempt,
    ProviderEvent,
    ProviderReceipt,
    TransitionReceipt,
)
from dunning.policy.cache import policy_spec
from dunning.policy.rollout import enforces_access as _pure_enforces
from dunning.states import AttemptState
from entitlements.models import EntitlementSnapshot
from entitlements.profiles import FULL
from entitlements.profiles import most_restrictive as _pure_most_restrictive
from subscriptions.models import Subscription
from tests.verification.simulation import reconciliation_check
from tests.verification.simulation.schedule import Step
from tests.verification.simulation.world import SimulatedWorld

FRESH_LIMIT = timedelta(seconds=300)
OWNER_DEADLINE = timedelta(hours=1)
RESTORE_BOUND = timedelta(seconds=60)  # SPEC §15: p99 confirmed payment → compliant recovery < 60 s
LOCAL_KEY = re.compile(r"^dunning-(?P<cycle>[0-9a-f-]{36})-attempt-(?P<n>\d+)$")
SETTLED_AFTER_PAID = {"RECOVERED", "EVIDENCE_CONFLICT", "CANCELED", "CLOSED_VOID"}
TERMINAL = {"CANCELED", "CLOSED_VOID"}
# SPEC §5: grace is a deadline. These states leave at grace_expires_at whatever the retry
# schedule says; an attempt in flight (PREPARED, DISPATCHING, UNKNOWN) holds the expiry.
GRACE_DEADLINE = ("GRACE_ACTIVE", "RETRY_SCHEDULED", "RETRY_FAILED")
IN_FLIGHT = {"PREPARED", "DISPATCHING", "UNKNOWN"}
JOB_PERIOD = timedelta(seconds=60)  # grace_expiry, contract_deadlines and alerts run every minute
CANCEL_CONFIRM_WITHIN = timedelta(hours=1)  # a dunning cancellation confirmed by the provider, or an alert
CLOCK_TOLERANCE = timedelta(seconds=5)  # a time guard's `now` may be this far after the trusted clock
ENDED_STATUSES = ("canceled", "incomplete_expired")  # applied with a recomputation at once: no period to act

# Violation codes (the README lists them).
CODES = (
    "DUPLICATE_CHARGE", "BLIND_RETRY", "UNPERSISTED_DISPATCH", "FULL_WHILE_BLOCKING", "ROOT_MISMATCH",
    "RESTRICTION_WITHOUT_FRESH_RECEIPT", "RESTRICTED_PAID_INVOICE", "STALE_GENERATION_COMMIT",
    "ENTITLEMENT_GENERATION_REGRESSED", "EVENT_NOT_ATTRIBUTED", "EVENT_NOT_PROCESSED", "UNKNOWN_NOT_OWNED",
    "FACT_DELETED_OR_ALTERED", "FABRICATED_PAYMENT", "TERMINAL_STATE_CHANGED", "NOT_RESTORED_IN_TIME",
    "JOB_CRASHED", "GRACE_OVERRUN", "ENDED_CONTRACT_FULL", "CANCEL_NOT_CONFIRMED", "TIME_GUARD_AHEAD_OF_CLOCK",
    "FUTURE_NOW_CHANGED_STATE", *reconciliation_check.CODES,
)


def time_guarded_edges() -> frozenset[str]:
    """Edges whose guard compares a deadline with `now` (cycle edges flagged `time_guarded`, and
    the subscription changes of `subscription_acceptance.TIME_GUARDED`)."""
    return frozenset({name for name, edge in EDGES.items() if edge.time_guarded} | set(TIME_GUARDED))


def contract_end(view: ContractView, now: datetime) -> datetime | None:
    """When the contract, as the application holds it, ended (None while it has not at `now`):
    the provider's status says so (known when it was fetched), or a date it carries passed."""
    if not _pure_is_ended(_pure_phase(view, now)):
        return None
    dates = [d for d in (view.ended_at, view.current_period_end if view.cancel_at_period_end else None)
             if d is not None and d <= now]
    return min(dates) if dates else None  # None here: ended by status alone



@dataclass(frozen=True)
class Violation:
    code: str
    step: int
    detail: str
    at: str = ""

    def __str__(self) -> str:
        return f"[step {self.step} @ {self.at}] {self.code}: {self.detail}"


def expected_local_key(cycle_id: object, n: int) -> str:
    """The auditor's own statement of the deterministic key (SPEC §9): same cycle and attempt
    number, same key — so even a crash before the key was stored resends under it."""
    return f"dunning-{cycle_id}-attempt-{n}"


class Auditor:
    def __init__(self, simulation: SimulatedWorld) -> None:
        self.s = simulation
        self._found: list[Violation] = []
        self._seen_codes: set[tuple[str, str]] = set()
        self.step = -1
        self.last_receipt_pk = 0
        self.fact_digests: dict[int, str] = {}
        self.terminal: dict[int, tuple[str, int]] = {}
        self.generations: dict[int, int] = {}
        self.keys_by_invoice: dict[str, list[str]] = {}
        self.checks = 0
        self.time_guarded = time_guarded_edges()
        self.entered: dict[int, datetime] = {}  # cycle pk -> when it entered its current state
        self.last_snapshot_pk = 0
        self.views: dict[int, ContractView] = {}  # subscription pk -> contract as held at the last check
        # Reports of earlier runs in this database are not judged against this run's simulator.
        self.last_report_pk = reconciliation_check.newest_report_pk()
        self.mirrors = reconciliation_check.MirrorWatch()

    # ---- reporting
    def report(self, code: str, detail: str) -> None:
        if (code, detail) in self._seen_codes:
            return
        self._seen_codes.add((code, detail))
        self._found.append(Violation(code, self.step, detail, self.s.now().isoformat()))

    def take(self) -> list[Violation]:
        found, self._found = self._found, []
        return found

    # ---- called by the engine's instrumentation, before the provider sees the request
    def on_pay_request(self, invoice_id: str, key: str) -> None:
        attempt = PaymentAttempt.objects.select_related("cycle__invoice", "cycle__policy").filter(
            idempotency_key=key).first()
        earlier = self.keys_by_invoice.setdefault(invoice_id, [])
        if attempt is None or attempt.cycle.invoice.provider_invoice_id != invoice_id:
            self.report("BLIND_RETRY", f"pay {invoice_id} under key {key!r} that no persisted attempt of it holds")
            earlier.append(key)
            return
        cycle = attempt.cycle
        if cycle.policy.retry_authority != "LOCAL":
            self.report("BLIND_RETRY", f"local pay request on {invoice_id} under provider retry authority")
        if attempt.state not in (AttemptState.DISPATCHING, AttemptState.UNKNOWN):
            self.report("UNPERSISTED_DISPATCH", f"pay {invoice_id} with attempt {attempt.operation_id} in "
                                                f"{attempt.state}, not a committed DISPATCHING/UNKNOWN")
        match = LOCAL_KEY.match(key)
        if not match or key != expected_local_key(cycle.cycle_id, int(match["n"])):
            self.report("BLIND_RETRY", f"pay {invoice_id} under key {key!r}: not the deterministic key of an "
                                       f"attempt slot of cycle {cycle.cycle_id} (a resend would be a new charge)")
        others = PaymentAttempt.objects.filter(cycle=cycle, state__in=(AttemptState.DISPATCHING,
                                                                       AttemptState.UNKNOWN)).exclude(pk=attempt.pk)
        for other in others:
            self.report("BLIND_RETRY", f"pay {invoice_id} under {key!r} while attempt {other.idempotency_key!r} "
                                       f"is {other.state} (unknown outcomes are resolved by query, same key)")
        if key not in earlier:
            earlier.append(key)

    # ---- after every step
    def check(self, *, step_index: int, step: Step | None, final: bool = False) -> None:
        self.step = step_index
        self.checks += 1
        subs = list(Subscription.objects.filter(provider_subscription_id__in=self.s.subscriptions)
                    .select_related("policy").order_by("pk"))
        ledger = self.s.sim.ledger
        sim_invoices = {i["id"]: i for i in self.s.invoices()}
        cycles = self.s.cycles()  # one read of the run's cycles for every check below
        self._money(ledger, sim_invoices)
        self._aggregates(subs, final)
        self._receipts(sim_invoices, ledger)
        new_snapshots = self._snapshots(subs)
        self._events(final)
        self._unknowns(cycles)
        self._facts(sim_invoices, ledger)
        self._cycles(sim_invoices, ledger, cycles)
        self._grace_deadlines(cycles)
        self._ended_contracts(subs, new_snapshots)
        self._cancellations(subs)
        self._reconciliation()

    def _reconciliation(self) -> None:
        """Each new reconciliation report against the simulator's ledger, both ways (a finding
        names a real difference; a real difference is found), and no invoice mirror that went
        back to an earlier status (SPEC §10, §15)."""
        found = (reconciliation_check.check_reports(self.s, since=self.last_report_pk)
                 + reconciliation_check.check_mirrors(self.s, self.mirrors))
        self.last_report_pk = reconciliation_check.newest_report_pk(self.last_report_pk)
        for code, detail in found:
            self.report(code, detail)

    def _money(self, ledger: list[dict[str, Any]], invoices: dict[str, Any]) -> None:
        """At most one successful charge per invoice (the ledger is the truth)."""
        counts: dict[str, int] = {}
        for entry in ledger:
            if entry["invoice"] in invoices:
                counts[entry["invoice"]] = counts.get(entry["invoice"], 0) + 1
        for invoice, n in counts.items():
            if n > 1:
                self.report("DUPLICATE_CHARGE", f"invoice {invoice} charged {n} times")

    def _aggregates(self, subs: list[Any], final: bool) -> None:
        """Stored root = recomputation; FULL only when no blocking cycle remains (SPEC §6, §7)."""
        for sub in subs:
            views = settlement.subscription_views(sub, None)
            root = _pure_root(views)
            spec = policy_spec(sub.policy)
            decision = _pure_decision(views, recover_with_remaining_debt=spec.recover_with_remaining_debt)
            product_root = settlement.compute_aggregate(sub, None)[0] if final else root
            key = sub.provider_subscription_id
            if sub.outstanding_cycle_root != root:
                self.report("ROOT_MISMATCH", f"{key}: stored root {sub.outstanding_cycle_root[:12]} ≠ recomputed "
                                             f"{root[:12]} over {len(views)} delinquent cycle(s)")
            elif product_root != root:
                self.report("ROOT_MISMATCH", f"{key}: compute_aggregate gives {product_root[:12]}, "
                                             f"the pure recomputation {root[:12]}")
            if sub.entitlement_profile == FULL and decision.profile != FULL and spec.mode == "ENFORCE":
                self.report("FULL_WHILE_BLOCKING", f"{key}: FULL at generation {sub.entitlement_generation} while "
                                                   f"the decision over its cycles is {decision.profile}")
            if root == EMPTY_ROOT and sub.entitlement_profile != FULL and spec.mode == "ENFORCE":
                # No debt: access is what the contract allows now (a pause, an ended contract), once
                # the contract_deadlines job has had its period after a date the contract carries.
                allowed = _pure_ceiling(_pure_phase(ContractView.of(sub), self.s.now()), spec)
                stricter = _pure_most_restrictive((sub.entitlement_profile, allowed)) == sub.entitlement_profile
                if stricter and sub.entitlement_profile != allowed and not self._contract_settling(sub):
                    self.report("NOT_RESTORED_IN_TIME", f"{key}: no blocking cycle, still {sub.entitlement_profile} "
                                                        f"(the contract allows {allowed})")

    def _receipts(self, invoices: dict[str, Any], ledger: list[dict[str, Any]]) -> None:
        """New transition receipts: generation fencing, and restriction/cancellation only on a
        fresh receipt showing the invoice unpaid (SPEC §5, §15)."""
        new = list(TransitionReceipt.objects.filter(
            pk__gt=self.last_receipt_pk, subscription__provider_subscription_id__in=self.s.subscriptions,
            accepted=True).select_related("cycle__invoice", "evidence_receipt").order_by("pk"))
        if new:
            self.last_receipt_pk = new[-1].pk
        latest = self.s.now() + CLOCK_TOLERANCE  # the clock only moves forward within a step
        for r in new:
            if r.edge in self.time_guarded and r.trusted_time > latest:
                self.report("TIME_GUARD_AHEAD_OF_CLOCK", f"receipt {r.pk} {r.edge} accepted at trusted_time "
                                                         f"{r.trusted_time.isoformat()}, after the clock "
                                                         f"({self.s.now().isoformat()}) + {CLOCK_TOLERANCE}")
            if r.cycle is None:
                continue
            if r.edge != "record_evidence" and r.to_state != r.from_state:
                self.entered[r.cycle_id] = r.trusted_time
            moved = r.edge != "record_evidence" and r.from_state not in TERMINAL
            expected = (r.expected or {}).get("cycle_generation")
            if moved and expected is not None and r.cycle_generation != expected + 1:
                self.report("STALE_GENERATION_COMMIT", f"receipt {r.pk} {r.edge} on cycle {r.cycle.cycle_id}: "
                                                       f"generation {r.cycle_generation}, expected {expected + 1}")
            if r.edge not in ("begin_restriction", "cancel") or r.cause_kind == CauseKind.USER:
                continue
            ev = r.evidence_receipt
            invoice_id = r.cycle.invoice.provider_invoice_id
            label = f"receipt {r.pk} {r.edge} on {invoice_id}"
            owed = ("open", "uncollectible", "paid") if r.cycle.dispute_reopened else ("open", "uncollectible")
            if ev is None:
                self.report("RESTRICTION_WITHOUT_FRESH_RECEIPT", f"{label}: no evidence receipt")
                continue
            if ev.object_type != "invoice" or ev.object_id != invoice_id:
                self.report("RESTRICTION_WITHOUT_FRESH_RECEIPT", f"{label}: cites {ev.object_type} {ev.object_id}")
            elif abs(r.trusted_time - ev.fetched_at) > FRESH_LIMIT:
                self.report("RESTRICTION_WITHOUT_FRESH_RECEIPT", f"{label}: receipt fetched {ev.fetched_at}")
            elif ev.status not in owed:
                self.report("RESTRICTION_WITHOUT_FRESH_RECEIPT", f"{label}: receipt shows {ev.status}")
            truth = invoices.get(invoice_id) or {}
            settled_at = [t for t in ((truth.get("status_transitions") or {}).get("paid_at"),
                                      (truth.get("status_transitions") or {}).get("voided_at")) if t]
            lost = any(e["invoice"] == invoice_id and e["dispute_status"] == "lost" for e in ledger)
            # In flight (accepted set): paid in the same second as the fetch, a stale read armed on it,
            # or debt reopened by a lost dispute.
            if (settled_at and min(settled_at) < ev.fetched_at.timestamp() and not lost
                    and invoice_id not in self.s.stale_invoices):
                self.report("RESTRICTED_PAID_INVOICE", f"{label}: the provider settled it at "
                                                       f"{datetime.fromtimestamp(min(settled_at), tz=UTC)}, before "
                                                       f"the fetch at {ev.fetched_at}")

    def _snapshots(self, subs: list[Any]) -> list[tuple[int, int, str, int, datetime]]:
        """Generations fenced and monotonic; returns the snapshots issued since the last check
        (pk, subscription pk, profile, generation, issued_at)."""
        by_sub: dict[int, list[int]] = {}
        new = []
        rows = (EntitlementSnapshot.objects.filter(subscription__in=[s.pk for s in subs])
                .order_by("issued_at", "pk").values_list("pk", "subscription_id", "profile", "generation", "issued_at"))
        for row in rows:
            by_sub.setdefault(row[1], []).append(row[3])
            if row[0] > self.last_snapshot_pk:
                new.append(row)
        new.sort()
        if new:
            self.last_snapshot_pk = new[-1][0]
        for sub in subs:
            gens = by_sub.get(sub.pk, [])
            if any(b <= a for a, b in zip(gens, gens[1:], strict=False)):
                self.report("STALE_GENERATION_COMMIT", f"{sub.provider_subscription_id}: snapshot generations {gens}")
            if gens and sub.entitlement_generation != max(gens):
                self.report("STALE_GENERATION_COMMIT", f"{sub.provider_subscription_id}: stored generation "
                                                       f"{sub.entitlement_generation}, newest snapshot {max(gens)}")
            before = self.generations.get(sub.pk, 0)
            if sub.entitlement_generation < before:
                self.report("ENTITLEMENT_GENERATION_REGRESSED", f"{sub.provider_subscription_id}: "
                                                                f"{before} → {sub.entitlement_generation}")
            self.generations[sub.pk] = max(before, sub.entitlement_generation)
        return new

    def _events(self, final: bool) -> None:
        """Every processed event attributed (SPEC §8, §15); at the end, none left unprocessed."""
        ok = {EventOutcome.APPLIED, EventOutcome.NO_CHANGE, EventOutcome.QUARANTINED, EventOutcome.IGNORED,
              EventOutcome.DUPLICATE}
        rows = (ProviderEvent.objects.filter(pk__gt=self.s.event_watermark)
                .exclude(outcome__in=(EventOutcome.APPLIED, EventOutcome.NO_CHANGE), subscription__isnull=False)
                .values_list("event_id", "event_type", "outcome", "outcome_detail", "processed_at", "error"))
        for event_id, kind, outcome, detail, processed_at, error in rows:
            if processed_at is not None and outcome not in ok:
                self.report("EVENT_NOT_ATTRIBUTED", f"{kind} {event_id}: {outcome} {detail[:160]}")
            elif processed_at is not None and outcome in (EventOutcome.APPLIED, EventOutcome.NO_CHANGE):
                self.report("EVENT_NOT_ATTRIBUTED", f"{kind} {event_id}: no subscription attached")
            elif processed_at is None and outcome == EventOutcome.FAILED:
                self.report("EVENT_NOT_ATTRIBUTED", f"{kind} {event_id}: processing failed: {error.strip()[-300:]}")
            elif processed_at is None and final:
                self.report("EVENT_NOT_PROCESSED", f"{kind} {event_id} still pending after the final catch-up")

    def _unknowns(self, cycles: list[Any]) -> None:
        """PAYMENT_UNKNOWN gets an owner within one hour of simulated time (SPEC §5). Accepted
        set: the hour overlapped a scheduler outage (nothing can assign then; see README)."""
        now = self.s.now()
        for cycle in cycles:
            since = cycle.unknown_since
            if cycle.state != "PAYMENT_UNKNOWN":
                continue
            if since is None or cycle.unknown_owner_id is not None or now - since <= OWNER_DEADLINE:
                continue
            if self.s.outage_overlaps(since, since + OWNER_DEADLINE):
                continue
            self.report("UNKNOWN_NOT_OWNED", f"cycle {cycle.cycle_id} unknown since {since}, no owner")

    def _facts(self, invoices: dict[str, Any], ledger: list[dict[str, Any]]) -> None:
        """Money facts are append-only (SPEC §2.6) and a payment fact has a charge behind it."""
        rows = MonetaryFact.objects.filter(invoice__provider_invoice_id__in=list(invoices)).values_list(
            "pk", "kind", "invoice__provider_invoice_id", "amount", "currency", "provider_ref", "decline_code",
            "dedupe_key", "occurred_at", "recorded_at")
        current: dict[int, str] = {}
        charged = {e["invoice"] for e in ledger}
        for row in rows:
            current[row[0]] = hashlib.sha256(repr(row).encode()).hexdigest()
            if row[1] == FactKind.PAYMENT_SUCCEEDED and row[2] not in charged and not invoices.get(
                    row[2], {}).get("paid_out_of_band"):
                self.report("FABRICATED_PAYMENT", f"PAYMENT_SUCCEEDED fact {row[0]} on {row[2]} with no charge")
        for pk, digest in self.fact_digests.items():
            if pk not in current:
                self.report("FACT_DELETED_OR_ALTERED", f"fact {pk} is gone")
            elif current[pk] != digest:
                self.report("FACT_DELETED_OR_ALTERED", f"fact {pk} changed")
        self.fact_digests.update(current)

    def _cycles(self, invoices: dict[str, Any], ledger: list[dict[str, Any]], cycles: list[Any]) -> None:
        """Terminal cycles stay put; a recovery has a paid invoice behind it; a paid invoice
        the product has held a paid receipt for is settled within the bound (SPEC §2.8, §15)."""
        now = self.s.now()
        lost = {e["invoice"] for e in ledger if e["dispute_status"] == "lost"}
        paid_since = dict(ProviderReceipt.objects.filter(object_type="invoice", status="paid",
                                                         object_id__in=[i for i, v in invoices.items()
                                                                        if v["status"] == "paid"])
                          .values("object_id").annotate(first=Min("fetched_at")).values_list("object_id", "first"))
        for cycle in cycles:
            invoice_id = cycle.invoice.provider_invoice_id
            truth = invoices.get(invoice_id, {})
            if cycle.pk in self.terminal and self.terminal[cycle.pk] != (cycle.state, cycle.generation):
                self.report("TERMINAL_STATE_CHANGED", f"cycle {cycle.cycle_id}: {self.terminal[cycle.pk]} → "
                                                      f"{(cycle.state, cycle.generation)}")
            if cycle.state in TERMINAL:
                self.terminal.setdefault(cycle.pk, (cycle.state, cycle.generation))
            if cycle.state == "RECOVERED" and truth.get("status") != "paid":
                self.report("FABRICATED_PAYMENT", f"cycle {cycle.cycle_id} RECOVERED, provider says "
                                                  f"{truth.get('status')}")
            if truth.get("status") == "paid" and invoice_id not in lost and not cycle.dispute_reopened \
                    and cycle.state not in SETTLED_AFTER_PAID:
                first_paid = paid_since.get(invoice_id)
                if first_paid is not None and now - first_paid > RESTORE_BOUND:
                    self.report("NOT_RESTORED_IN_TIME", f"cycle {cycle.cycle_id} still {cycle.state}; paid receipt "
                                                        f"held since {first_paid}")

    # ---- grace deadline and the contract line
    def _grace_deadlines(self, cycles: list[Any]) -> None:
        """Grace ends at grace_expires_at whatever the retry schedule says (SPEC §5): no cycle stays
        in GRACE_ACTIVE / RETRY_SCHEDULED / RETRY_FAILED more than one grace_expiry period past its
        deadline (or past entering that state, if later) unless an attempt is in flight. Accepted
        set: the scheduler was down (an injected outage, or a stretch the engine jumped) when the
        deadline came; then the period runs from when it was back."""
        now = self.s.now()
        for cycle in cycles:
            deadline = cycle.grace_expires_at
            attempt = cycle.pending_attempt
            if cycle.state not in GRACE_DEADLINE or deadline is None or deadline > now or (
                    attempt is not None and attempt.state in IN_FLIGHT):
                continue
            due = self.s.scheduler_due(max(deadline, self.entered.get(cycle.pk, cycle.opened_at)), JOB_PERIOD)
            if now > due:
                self.report("GRACE_OVERRUN", f"cycle {cycle.cycle_id} ({cycle.invoice.provider_invoice_id}) still "
                                             f"{cycle.state} at {now.isoformat()}; grace ended {deadline.isoformat()}, "
                                             f"no attempt in flight (next provider retry "
                                             f"{cycle.next_attempt_at.isoformat() if cycle.next_attempt_at else '-'})")

    def _contract_settling(self, sub: Any) -> bool:
        """A date the held contract carries (period end of a contract set to cancel then, its end
        date, a pause's resume time) passed less than one contract_deadlines period ago, counted
        from when the application could know it and the scheduler could act."""
        now = self.s.now()
        dates = [d for d in (sub.current_period_end if sub.cancel_at_period_end else None, sub.contract_ended_at,
                             sub.pause_resumes_at) if d is not None and d <= now]
        known = sub.contract_fetched_at
        return any(now <= self.s.scheduler_due(max(d, known) if known else d, JOB_PERIOD) for d in dates)

    def _ended_contracts(self, subs: list[Any], new_snapshots: list[tuple[int, int, str, int, datetime]]) -> None:
        """No FULL access on a contract past its end (SPEC §7), for subscriptions whose policy
        enforces access: neither the current profile (once the contract_deadlines job has had a
        period after an end date the held contract carries; at once when the provider's status
        says it ended) nor a FULL snapshot issued after the end as the application held it then."""
        now = self.s.now()
        enforced = {}
        for sub in subs:
            spec = policy_spec(sub.policy)
            enforced[sub.pk] = _pure_enforces(spec, subscription_key=sub.provider_subscription_id, cohort=sub.cohort)
            view = ContractView.of(sub)
            if not enforced[sub.pk] or sub.entitlement_profile != FULL or not _pure_is_ended(_pure_phase(view, now)):
                continue
            end = contract_end(view, now)
            if sub.provider_status not in ENDED_STATUSES and self._contract_settling(sub):
                continue  # ended by a date it carries: the contract_deadlines job has a period to act
            self.report("ENDED_CONTRACT_FULL", f"{sub.provider_subscription_id}: FULL at generation "
                                               f"{sub.entitlement_generation} on a contract that ended "
                                               f"{(end or sub.contract_fetched_at or now).isoformat()} "
                                               f"(status {sub.provider_status})")
        by_pk = {sub.pk: sub for sub in subs}
        for _pk, sub_pk, profile, generation, issued_at in new_snapshots:
            held = self.views.get(sub_pk)  # the contract as held before this step (it only ever moves on)
            if profile != FULL or held is None or not enforced.get(sub_pk):
                continue
            if _pure_is_ended(_pure_phase(held, issued_at)):
                self.report("ENDED_CONTRACT_FULL", f"{by_pk[sub_pk].provider_subscription_id}: FULL snapshot "
                                                   f"generation {generation} issued {issued_at.isoformat()} on a "
                                                   f"contract already held as ended")
        self.views = {sub.pk: ContractView.of(sub) for sub in subs}

    def _cancellations(self, subs: list[Any]) -> None:
        """A cancellation dunning carried to the provider (provider_cancel_requested_at) is
        confirmed within the hour, or a CANCEL_UNCONFIRMED alert is raised by one alerts period
        later (SPEC §7). Accepted set: the scheduler was down when the hour ran out."""
        now = self.s.now()
        for sub in subs:
            asked = sub.provider_cancel_requested_at
            if asked is None:
                continue
            confirmed = sub.provider_cancel_confirmed_at
            due = self.s.scheduler_due(asked + CANCEL_CONFIRM_WITHIN, JOB_PERIOD)
            if now <= due or (confirmed is not None and confirmed <= due):
                continue
            if not Alert.objects.filter(kind="CANCEL_UNCONFIRMED", subscription=sub).exists():
                self.report("CANCEL_NOT_CONFIRMED", f"{sub.provider_subscription_id}: cancellation requested at the "
                                                    f"provider {asked.isoformat()}, "
                                                    + (f"confirmed only {confirmed.isoformat()}" if confirmed else
                                                       "still unconfirmed") + ", and no CANCEL_UNCONFIRMED alert")
