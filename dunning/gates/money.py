"""Money gates: part (b) of full-while-blocking, duplicate charges, restriction without a fresh receipt."""

from __future__ import annotations

from django.db.models import Exists, Max, OuterRef, Q

from dunning.acceptance.aggregate import EMPTY_ROOT, CycleView, aggregate_decision, outstanding_root
from dunning.acceptance.guards import UNPAID_STATUSES, fresh_receipt_max_age
from dunning.actions.alerts import duplicate_charge_invoices
from dunning.models import CauseKind, DunningCycle, FactKind, MonetaryFact, PaymentAttempt, TransitionReceipt
from dunning.states import DELINQUENT_STATES, AttemptState
from entitlements.models import EntitlementSnapshot
from entitlements.profiles import FULL
from subscriptions.models import Invoice

from .definitions import BATCH, DETAIL_LIMIT, RESTRICTING_EDGES
from .report import Gate, _count_gate, _Offenders, _PolicySpecs


def _full_snapshots_with_debt(specs: _PolicySpecs, offenders: _Offenders) -> int:
    """Part (b) of full-while-blocking: FULL snapshots issued while the cause receipt still saw debt."""
    full = EntitlementSnapshot.objects.filter(profile=FULL)
    checked = full.count()
    suspicious = full.filter(Q(cause_receipt__isnull=True) | ~Q(cause_receipt__root_after=EMPTY_ROOT)).order_by("pk")
    rows = suspicious.values_list("pk", "subscription_id", "subscription__provider_subscription_id", "generation",
                                  "cause_receipt_id", "cause_receipt__root_after", "cause_receipt__policy_id",
                                  "subscription__policy_id")
    for _pk, sub_pk, sub_key, generation, receipt_pk, root_after, receipt_policy, sub_policy in rows.iterator(
            chunk_size=BATCH):
        label = f"{sub_key}@{generation}"
        if receipt_pk is None:
            offenders.add(label, "FULL snapshot without a cause receipt")
            continue
        spec = specs[receipt_policy or sub_policy]
        views = _views_at_receipt(sub_pk, receipt_pk, specs)
        if views is not None and outstanding_root(views) == root_after:
            decision = aggregate_decision(views, recover_with_remaining_debt=spec.recover_with_remaining_debt)
            if decision.profile != FULL:
                offenders.add(label, f"FULL issued while the decision was {decision.profile}")
        elif not spec.recover_with_remaining_debt:
            offenders.add(label, "FULL issued with debt outstanding; cycles at that receipt not reproducible")
    return checked


def _views_at_receipt(subscription_pk: int, receipt_pk: int, specs: _PolicySpecs) -> list[CycleView] | None:
    """The subscription's delinquent cycles as they stood when receipt `receipt_pk` was written."""
    upto = TransitionReceipt.objects.filter(subscription_id=subscription_pk, accepted=True, cycle__isnull=False,
                                            cycle_generation__isnull=False, pk__lte=receipt_pk)
    # The newest receipt per cycle (portable: SQLite has no DISTINCT ON).
    newest = upto.order_by().values("cycle_id").annotate(newest=Max("pk")).values("newest")
    latest = (TransitionReceipt.objects.filter(pk__in=newest).order_by("cycle_id")
              .values_list("cycle_id", "cycle_generation", "to_state"))
    cycle_history = DunningCycle.history.model
    invoice_history = Invoice.history.model
    views: list[CycleView] = []
    for cycle_pk, generation, to_state in latest:
        if to_state not in DELINQUENT_STATES:
            continue
        past = (cycle_history.objects.filter(id=cycle_pk, generation=generation).order_by("-history_id")
                .values("cycle_id", "state", "invoice_id", "provider_generation", "dispute_reopened",
                        "exception_profile", "conflict_held_profile", "policy_id").first())
        if past is None:
            return None
        status = (invoice_history.objects.filter(id=past["invoice_id"], revision=past["provider_generation"])
                  .order_by("-history_id").values_list("status", flat=True).first())
        if status is None:
            return None
        views.append(CycleView(
            cycle_id=str(past["cycle_id"]), generation=generation, state=past["state"], invoice_status=status,
            dispute_reopened=past["dispute_reopened"], exception_profile=past["exception_profile"],
            conflict_held_profile=past["conflict_held_profile"], spec=specs[past["policy_id"]],
        ))
    return views


def _gate_duplicate_charges() -> Gate:
    """See GATE_DEFINITIONS["duplicate_charges"]."""
    paid_facts = MonetaryFact.objects.filter(kind=FactKind.PAYMENT_SUCCEEDED)
    succeeded = PaymentAttempt.objects.filter(state=AttemptState.SUCCEEDED)
    charged = Invoice.objects.filter(Exists(paid_facts.filter(invoice_id=OuterRef("pk")))
                                     | Exists(succeeded.filter(cycle__invoice_id=OuterRef("pk"))))
    by_fact, by_attempt = duplicate_charge_invoices()
    duplicated = Invoice.objects.filter(Q(pk__in=by_fact) | Q(pk__in=by_attempt))
    offenders = _Offenders()
    count = duplicated.count()
    offenders.extend(count, duplicated.order_by("pk").values_list("provider_invoice_id", flat=True)[:DETAIL_LIMIT])
    return _count_gate("duplicate_charges", "duplicate charges", offenders, charged.count(),
                       note="invoices with at least one successful charge checked")


def _gate_restriction_without_fresh_receipt() -> Gate:
    """See GATE_DEFINITIONS["restriction_without_fresh_receipt"]."""
    limit = fresh_receipt_max_age()
    receipts = (TransitionReceipt.objects.filter(accepted=True, edge__in=RESTRICTING_EDGES)
                .exclude(cause_kind=CauseKind.USER).order_by("pk"))
    offenders = _Offenders()
    n = 0
    rows = receipts.values_list(
        "pk", "edge", "cycle__cycle_id", "cycle__invoice_id", "cycle__invoice__provider_invoice_id",
        "cycle__dispute_reopened", "trusted_time", "evidence_receipt_id", "evidence_receipt__object_type",
        "evidence_receipt__object_id", "evidence_receipt__invoice_id", "evidence_receipt__fetched_at",
        "evidence_receipt__status",
    )
    for (pk, edge, cycle_id, invoice_pk, invoice_ref, reopened, trusted_time, evidence_pk, object_type, object_id,
         evidence_invoice_pk, fetched_at, status) in rows.iterator(chunk_size=BATCH):
        n += 1
        label = f"receipt {pk} {edge} cycle {cycle_id}"
        if evidence_pk is None:
            offenders.add(label, "no evidence receipt")
        elif (object_type != "invoice" or object_id != invoice_ref
              or evidence_invoice_pk not in (None, invoice_pk)):
            offenders.add(label, f"evidence is {object_type} {object_id}, not invoice {invoice_ref}")
        elif abs(trusted_time - fetched_at) > limit:
            offenders.add(label, f"evidence fetched {(trusted_time - fetched_at).total_seconds():.0f}s "
                                 f"from the decision; limit {limit.total_seconds():.0f}s")
        elif status not in (*UNPAID_STATUSES, *(("paid",) if reopened else ())):
            offenders.add(label, f"evidence shows invoice {status}")
    return _count_gate("restriction_without_fresh_receipt",
                       "automatic restriction or cancellation without a fresh receipt", offenders, n)
