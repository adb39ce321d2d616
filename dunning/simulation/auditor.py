"""Invariants checked after every simulation step, against the simulator's ledger as the
monetary truth and against the application's database.

Each check names the rule it guards (SPEC §2, §5–§10, §15). Where a delivery or a fetch was in
flight the auditor accepts the set of outcomes the product could legitimately have reached
(noted at each check). The pure aggregate functions are bound at import, so a build that
breaks the product's recomputation cannot also break the auditor's.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from dunning.aggregate import EMPTY_ROOT
from dunning.aggregate import aggregate_decision as _pure_decision
from dunning.aggregate import outstanding_root as _pure_root

if TYPE_CHECKING:
    from dunning.simulation.engine import Simulation
    from dunning.simulation.schedule import Step

FRESH_LIMIT = timedelta(seconds=300)
OWNER_DEADLINE = timedelta(hours=1)
RESTORE_BOUND = timedelta(seconds=60)  # SPEC §15: p99 confirmed payment → compliant recovery < 60 s
LOCAL_KEY = re.compile(r"^dunning-(?P<cycle>[0-9a-f-]{36})-attempt-(?P<n>\d+)$")
SETTLED_AFTER_PAID = {"RECOVERED", "EVIDENCE_CONFLICT", "CANCELED", "CLOSED_VOID"}
TERMINAL = {"CANCELED", "CLOSED_VOID"}

# Violation codes (the README lists them).
CODES = (
    "DUPLICATE_CHARGE", "BLIND_RETRY", "UNPERSISTED_DISPATCH", "FULL_WHILE_BLOCKING", "ROOT_MISMATCH",
    "RESTRICTION_WITHOUT_FRESH_RECEIPT", "RESTRICTED_PAID_INVOICE", "STALE_GENERATION_COMMIT",
    "ENTITLEMENT_GENERATION_REGRESSED", "EVENT_NOT_ATTRIBUTED", "EVENT_NOT_PROCESSED", "UNKNOWN_NOT_OWNED",
    "FACT_DELETED_OR_ALTERED", "FABRICATED_PAYMENT", "TERMINAL_STATE_CHANGED", "NOT_RESTORED_IN_TIME",
    "JOB_CRASHED",
)


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
    def __init__(self, simulation: Simulation) -> None:
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
        from dunning.models import PaymentAttempt
        from dunning.states import AttemptState

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
        from subscriptions.models import Subscription

        self.step = step_index
        self.checks += 1
        subs = list(Subscription.objects.filter(provider_subscription_id__in=self.s.subscriptions)
                    .select_related("policy").order_by("pk"))
        ledger = self.s.sim.ledger
        sim_invoices = {i["id"]: i for i in self.s.invoices()}
        self._money(ledger, sim_invoices)
        self._aggregates(subs, final)
        self._receipts(sim_invoices, ledger)
        self._snapshots(subs)
        self._events(final)
        self._unknowns()
        self._facts(sim_invoices, ledger)
        self._cycles(sim_invoices, ledger)

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
        from dunning.policy_cache import policy_spec
        from dunning.services.recompute import compute_aggregate, subscription_views
        from entitlements.profiles import FULL

        for sub in subs:
            views = subscription_views(sub, None)
            root = _pure_root(views)
            spec = policy_spec(sub.policy)
            decision = _pure_decision(views, recover_with_remaining_debt=spec.recover_with_remaining_debt)
            product_root = compute_aggregate(sub, None)[0] if final else root
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
                self.report("NOT_RESTORED_IN_TIME", f"{key}: no blocking cycle, still {sub.entitlement_profile}")

    def _receipts(self, invoices: dict[str, Any], ledger: list[dict[str, Any]]) -> None:
        """New transition receipts: generation fencing, and restriction/cancellation only on a
        fresh receipt showing the invoice unpaid (SPEC §5, §15)."""
        from dunning.models import CauseKind, TransitionReceipt

        new = list(TransitionReceipt.objects.filter(
            pk__gt=self.last_receipt_pk, subscription__provider_subscription_id__in=self.s.subscriptions,
            accepted=True).select_related("cycle__invoice", "evidence_receipt").order_by("pk"))
        if new:
            self.last_receipt_pk = new[-1].pk
        for r in new:
            if r.cycle is None:
                continue
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

    def _snapshots(self, subs: list[Any]) -> None:
        from entitlements.models import EntitlementSnapshot

        by_sub: dict[int, list[int]] = {}
        rows = (EntitlementSnapshot.objects.filter(subscription__in=[s.pk for s in subs])
                .order_by("issued_at", "pk").values_list("subscription_id", "generation"))
        for sub_pk, generation in rows:
            by_sub.setdefault(sub_pk, []).append(generation)
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

    def _events(self, final: bool) -> None:
        """Every processed event attributed (SPEC §8, §15); at the end, none left unprocessed."""
        from dunning.models import EventOutcome, ProviderEvent

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

    def _unknowns(self) -> None:
        """PAYMENT_UNKNOWN gets an owner within one hour of simulated time (SPEC §5). Accepted
        set: the hour overlapped a scheduler outage (nothing can assign then; see README)."""
        now = self.s.now()
        for cycle in self.s.cycles("PAYMENT_UNKNOWN"):
            since = cycle.unknown_since
            if since is None or cycle.unknown_owner_id is not None or now - since <= OWNER_DEADLINE:
                continue
            if self.s.outage_overlaps(since, since + OWNER_DEADLINE):
                continue
            self.report("UNKNOWN_NOT_OWNED", f"cycle {cycle.cycle_id} unknown since {since}, no owner")

    def _facts(self, invoices: dict[str, Any], ledger: list[dict[str, Any]]) -> None:
        """Money facts are append-only (SPEC §2.6) and a payment fact has a charge behind it."""
        from dunning.models import FactKind, MonetaryFact

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

    def _cycles(self, invoices: dict[str, Any], ledger: list[dict[str, Any]]) -> None:
        """Terminal cycles stay put; a recovery has a paid invoice behind it; a paid invoice
        the product has held a paid receipt for is settled within the bound (SPEC §2.8, §15)."""
        from django.db.models import Min

        from dunning.models import ProviderReceipt

        now = self.s.now()
        lost = {e["invoice"] for e in ledger if e["dispute_status"] == "lost"}
        paid_since = dict(ProviderReceipt.objects.filter(object_type="invoice", status="paid",
                                                         object_id__in=[i for i, v in invoices.items()
                                                                        if v["status"] == "paid"])
                          .values("object_id").annotate(first=Min("fetched_at")).values_list("object_id", "first"))
        for cycle in self.s.cycles():
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
