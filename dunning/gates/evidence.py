"""Evidence gates: event attribution, root consistency and part (a) of full-while-blocking."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Count, OuterRef, Q, Subquery

from dunning.acceptance.aggregate import CycleView, aggregate_decision, is_blocking, outstanding_root
from dunning.acceptance.settlement import compute_aggregate
from dunning.models import DunningCycle, EventOutcome, ProviderEvent
from dunning.policy.rollout import enforces_access
from dunning.states import DELINQUENT_STATES
from entitlements.models import EntitlementSnapshot
from entitlements.profiles import FULL
from subscriptions.models import Subscription

from .definitions import (
    ATTRIBUTED_OUTCOMES,
    BATCH,
    DETAIL_LIMIT,
    HELD_OR_LEGITIMATE_OUTCOMES,
    PENDING_LIMIT,
)
from .money import _full_snapshots_with_debt
from .report import Gate, _count_gate, _keyset, _Offenders, _PolicySpecs, _rate_gate


def _gate_event_attribution(now: datetime) -> Gate:
    """See GATE_DEFINITIONS["event_attribution"]."""
    counted = ProviderEvent.objects.filter(
        ~Q(outcome=EventOutcome.PENDING) | Q(outcome=EventOutcome.PENDING, received_at__lt=now - PENDING_LIMIT)
    )
    ok = Q(outcome__in=HELD_OR_LEGITIMATE_OUTCOMES) | Q(outcome__in=ATTRIBUTED_OUTCOMES, subscription__isnull=False)
    totals = counted.aggregate(n=Count("pk"), ok=Count("pk", filter=ok))
    offenders = _Offenders()
    for event_id, outcome in (counted.exclude(ok).order_by("received_at", "pk")
                              .values_list("event_id", "outcome")[:DETAIL_LIMIT]):
        offenders.add(event_id, "PENDING > 10 min" if outcome == EventOutcome.PENDING else outcome)
    return _rate_gate("event_attribution", "event attribution rate", totals["ok"], totals["n"], offenders)


_CYCLE_VIEW_FIELDS = ("subscription_id", "cycle_id", "generation", "state", "invoice__status", "dispute_reopened",
                      "exception_profile", "conflict_held_profile", "policy_id")


def _view(row: dict[str, Any], specs: _PolicySpecs) -> CycleView:
    """Same inputs as dunning.acceptance.settlement.cycle_view, read as plain values."""
    return CycleView(
        cycle_id=str(row["cycle_id"]), generation=row["generation"], state=row["state"],
        invoice_status=row["invoice__status"], dispute_reopened=row["dispute_reopened"],
        exception_profile=row["exception_profile"], conflict_held_profile=row["conflict_held_profile"],
        spec=specs[row["policy_id"]],
    )


def _gates_root_and_full_restoration(specs: _PolicySpecs) -> tuple[Gate, Gate]:
    """Root consistency and part (a) of full-while-blocking share one pass over subscriptions,
    each page joined with that page's delinquent cycles."""
    newest_profile = Subquery(EntitlementSnapshot.objects.filter(subscription_id=OuterRef("pk"))
                              .order_by("-generation").values("profile")[:1])
    subscriptions = Subscription.objects.annotate(newest_profile=newest_profile)
    roots_ok = total = 0
    root_offenders, full_offenders = _Offenders(), _Offenders()
    for page in _keyset(subscriptions, ("provider_subscription_id", "outstanding_cycle_root", "entitlement_profile",
                                        "newest_profile", "policy_id", "cohort")):
        views: dict[int, list[CycleView]] = {row["pk"]: [] for row in page}
        cycles = DunningCycle.objects.filter(subscription_id__in=list(views), state__in=DELINQUENT_STATES)
        for row in cycles.values(*_CYCLE_VIEW_FIELDS).iterator(chunk_size=BATCH):
            views[row["subscription_id"]].append(_view(row, specs))
        for sub in page:
            total += 1
            sub_views = views[sub["pk"]]
            if _root_consistent(sub, sub_views):
                roots_ok += 1
            else:
                root_offenders.add(sub["provider_subscription_id"])
            if FULL in (sub["entitlement_profile"], sub["newest_profile"]) and any(map(is_blocking, sub_views)):
                spec = specs[sub["policy_id"]]
                if not enforces_access(spec, subscription_key=sub["provider_subscription_id"], cohort=sub["cohort"],
                                       subscription_pk=sub["pk"], stage=specs.stage(spec, sub["cohort"])):
                    continue
                decision = aggregate_decision(sub_views, recover_with_remaining_debt=spec.recover_with_remaining_debt)
                if decision.profile != FULL:
                    full_offenders.add(sub["provider_subscription_id"], f"FULL while decision is {decision.profile}")
    root_gate = _rate_gate("root_consistency", "root recomputation consistency", roots_ok, total, root_offenders)
    checked_snapshots = _full_snapshots_with_debt(specs, full_offenders)
    full_gate = _count_gate("full_while_blocking", "full restoration while a blocking cycle remains", full_offenders,
                            total + checked_snapshots,
                            note=f"{total} subscriptions and {checked_snapshots} FULL snapshots checked")
    return root_gate, full_gate


def _root_consistent(sub: dict[str, Any], views: list[CycleView]) -> bool:
    if outstanding_root(views) == sub["outstanding_cycle_root"]:
        return True
    # Confirm with the acceptance service's own recomputation before calling it a fault.
    subscription = Subscription.objects.select_related("policy").get(pk=sub["pk"])
    root, _ = compute_aggregate(subscription, None)
    return root == subscription.outstanding_cycle_root
