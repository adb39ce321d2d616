"""Timing gates: payment → recovery p99, PAYMENT_UNKNOWN ownership within 1 h, blind retries."""

from __future__ import annotations

import math
import re
from datetime import datetime

from django.db.models import Exists, Min, OuterRef, Q, Subquery
from django.db.models.fields.json import KT

from dunning.acceptance.aggregate import EMPTY_ROOT
from dunning.acceptance.edges import local_idempotency_key
from dunning.models import (
    PAID_EVENT_TYPES,
    AttemptOrigin,
    DunningCycle,
    FactKind,
    MonetaryFact,
    PaymentAttempt,
    ProviderEvent,
    TransitionReceipt,
)
from dunning.policy.rollout import enforces_access
from dunning.states import AttemptState, CycleState
from entitlements.models import EntitlementSnapshot
from entitlements.profiles import FULL

from .definitions import BATCH, LATENCY_LIMIT_SECONDS, OWNER_DEADLINE
from .report import Gate, _count_gate, _Offenders, _PolicySpecs, _rate_gate


def _gate_payment_to_recovery_p99(now: datetime, specs: _PolicySpecs) -> Gate:
    """See GATE_DEFINITIONS["payment_to_recovery_p99"]."""
    paid_events = ProviderEvent.objects.filter(event_type__in=PAID_EVENT_TYPES).order_by("received_at")
    by_fk = paid_events.filter(invoice_id=OuterRef("cycle__invoice_id"))
    by_payload = (paid_events.filter(invoice__isnull=True).annotate(object_id=KT("payload__data__object__id"))
                  .filter(object_id=OuterRef("cycle__invoice__provider_invoice_id")))
    first_fact = (MonetaryFact.objects.filter(kind=FactKind.PAYMENT_SUCCEEDED, invoice_id=OuterRef("cycle__invoice_id"))
                  .order_by("recorded_at"))
    snapshots = EntitlementSnapshot.objects.filter(subscription_id=OuterRef("subscription_id"))
    first_full = (snapshots.filter(profile=FULL, generation__gte=OuterRef("entitlement_generation"))
                  .order_by("generation"))
    recover_receipts = TransitionReceipt.objects.filter(accepted=True, edge="recover", cycle__isnull=False)
    first_per_cycle = recover_receipts.order_by().values("cycle_id").annotate(first=Min("pk")).values("first")
    recoveries = (TransitionReceipt.objects.filter(pk__in=first_per_cycle).order_by("cycle_id")
                  .annotate(event_fk_at=Subquery(by_fk.values("received_at")[:1]),
                            event_payload_at=Subquery(by_payload.values("received_at")[:1]),
                            fact_at=Subquery(first_fact.values("recorded_at")[:1]),
                            full_at=Subquery(first_full.values("issued_at")[:1])))
    rows = recoveries.values_list("cycle__cycle_id", "trusted_time", "root_after", "policy_id",
                                  "subscription__policy_id", "subscription__provider_subscription_id",
                                  "subscription__cohort", "event_fk_at", "event_payload_at", "fact_at", "full_at",
                                  "subscription_id")
    latencies: list[float] = []
    offenders = _Offenders()
    unmeasured = 0
    for (cycle_id, decided_at, root_after, policy_id, sub_policy_id, sub_key, cohort, event_fk_at, event_payload_at,
         fact_at, full_at, subscription_pk) in rows.iterator(chunk_size=BATCH):
        events = [t for t in (event_fk_at, event_payload_at) if t is not None]
        start = min(events) if events else fact_at
        if start is None:
            unmeasured += 1
            offenders.add(f"cycle {cycle_id}", "recovered with no payment event or PAYMENT_SUCCEEDED fact")
            continue
        end = decided_at
        spec = specs[policy_id or sub_policy_id]
        if root_after == EMPTY_ROOT and enforces_access(spec, subscription_key=sub_key, cohort=cohort,
                                                        subscription_pk=subscription_pk, now=now,
                                                        stage=specs.stage(spec, cohort)):
            end = max(end, full_at) if full_at is not None else now
        latency = max((end - start).total_seconds(), 0.0)
        latencies.append(latency)
        if latency >= LATENCY_LIMIT_SECONDS:
            offenders.add(f"cycle {cycle_id}", f"{latency:.1f}s" + ("" if full_at or root_after != EMPTY_ROOT
                                                                     else ", access not restored"))
    n = len(latencies) + unmeasured
    if not latencies:
        return Gate(key="payment_to_recovery_p99", name="p99 confirmed payment → compliant recovery", figure=None,
                    display="n/a" if n == 0 else f"n/a ({unmeasured} unmeasurable)", unit="s",
                    threshold=f"< {LATENCY_LIMIT_SECONDS:.0f} s", passed=unmeasured == 0,
                    detail=tuple(offenders.ids), sample_size=n, offending=offenders.count)
    latencies.sort()
    p99 = latencies[max(math.ceil(0.99 * len(latencies)) - 1, 0)]
    display = f"{p99:.3f} s (n={len(latencies)}, max {latencies[-1]:.3f} s)"
    if unmeasured:
        display += f", {unmeasured} unmeasurable"
    return Gate(key="payment_to_recovery_p99", name="p99 confirmed payment → compliant recovery",
                figure=round(p99, 3), display=display, unit="s", threshold=f"< {LATENCY_LIMIT_SECONDS:.0f} s",
                passed=p99 < LATENCY_LIMIT_SECONDS and unmeasured == 0, detail=tuple(offenders.ids), sample_size=n,
                offending=offenders.count)


def _gate_unknown_owned_within_1h(now: datetime) -> Gate:
    """See GATE_DEFINITIONS["unknown_owned_within_1h"]."""
    later = TransitionReceipt.objects.filter(accepted=True, cycle_id=OuterRef("cycle_id"), pk__gt=OuterRef("pk"))
    owned = later.filter(edge="assign_unknown_owner").order_by("pk").values("trusted_time")[:1]
    left = (later.filter(from_state=CycleState.PAYMENT_UNKNOWN).exclude(to_state=CycleState.PAYMENT_UNKNOWN)
            .order_by("pk").values("trusted_time")[:1])
    marks = (TransitionReceipt.objects.filter(accepted=True, edge="mark_unknown", cycle__isnull=False)
             .annotate(owned_at=Subquery(owned), left_at=Subquery(left)).order_by("pk"))
    ok = n = 0
    offenders = _Offenders()
    rows = marks.values_list("cycle__cycle_id", "trusted_time", "owned_at", "left_at",
                             "cycle__unknown_owner_assigned_at")
    for cycle_id, start, owned_at, left_at, assigned_at in rows.iterator(chunk_size=BATCH):
        n += 1
        if _owned_in_time(start, now, owned_at, left_at, assigned_at):
            ok += 1
        else:
            offenders.add(f"cycle {cycle_id}", f"unknown since {start.isoformat()}, no owner within 1 h")
    unreceipted = (DunningCycle.objects.filter(state=CycleState.PAYMENT_UNKNOWN)
                   .exclude(Exists(TransitionReceipt.objects.filter(cycle_id=OuterRef("pk"), accepted=True,
                                                                    edge="mark_unknown")))
                   .order_by("pk").values_list("cycle_id", "unknown_since", "updated_at", "unknown_owner_assigned_at"))
    for cycle_id, since, updated_at, assigned_at in unreceipted.iterator(chunk_size=BATCH):
        n += 1
        start = since or updated_at
        if _owned_in_time(start, now, None, None, assigned_at):
            ok += 1
        else:
            offenders.add(f"cycle {cycle_id}", "PAYMENT_UNKNOWN without a mark_unknown receipt, no owner within 1 h")
    return _rate_gate("unknown_owned_within_1h", "share of PAYMENT_UNKNOWN with an owner within 1 h", ok, n, offenders)


def _owned_in_time(start: datetime, now: datetime, owned_at: datetime | None, left_at: datetime | None,
                   assigned_at: datetime | None) -> bool:
    deadline = start + OWNER_DEADLINE
    if now < deadline:
        return True
    if assigned_at is not None and start <= assigned_at <= deadline:
        return True
    return any(t is not None and t <= deadline for t in (owned_at, left_at))


def _slot_pattern() -> re.Pattern[str]:
    """The deterministic local key (dunning.acceptance.edges.local_idempotency_key) as a pattern."""
    cycle_marker, number_marker = "CYCLEMARKER", 987654321
    template = re.escape(local_idempotency_key(cycle_marker, number_marker))
    template = template.replace(cycle_marker, "(?P<cycle>.+)").replace(str(number_marker), r"(?P<n>\d+)")
    return re.compile(f"^{template}$")


def _gate_blind_retries() -> Gate:
    """See GATE_DEFINITIONS["blind_retries"]. One ordered pass; each offending attempt counts once."""
    offenders = _Offenders()
    local = PaymentAttempt.objects.filter(origin=AttemptOrigin.LOCAL)
    in_flight = (PaymentAttempt.objects.filter(cycle_id=OuterRef("cycle_id"))
                 .filter(Q(created_at__lt=OuterRef("created_at")) | Q(created_at=OuterRef("created_at"),
                                                                      pk__lt=OuterRef("pk")))
                 .filter(Q(dispatched_at__lte=OuterRef("created_at"))
                         | Q(dispatched_at__isnull=True,
                             state__in=(AttemptState.DISPATCHING, AttemptState.UNKNOWN)))
                 .filter(Q(resolved_at__isnull=True) | Q(resolved_at__gt=OuterRef("created_at"))))
    pattern = _slot_pattern()
    seen: set[int] = set()
    current_cycle = None
    n = 0
    rows = (local.annotate(blind=Exists(in_flight)).order_by("cycle_id", "created_at", "pk")
            .values_list("cycle_id", "cycle__cycle_id", "operation_id", "idempotency_key", "blind"))
    for cycle_pk, cycle_id, operation_id, key, blind in rows.iterator(chunk_size=BATCH):
        n += 1
        if cycle_pk != current_cycle:
            current_cycle, seen = cycle_pk, set()
        label = f"attempt {operation_id} cycle {cycle_id}"
        match = pattern.match(key)
        slot = int(match.group("n")) if match and match.group("cycle") == str(cycle_id) else None
        if blind:
            offenders.add(label, "created while an earlier attempt was in flight")
        elif slot is None:
            offenders.add(label, f"key {key!r} is not a slot key of its cycle")
        elif slot in seen:
            offenders.add(label, f"another attempt already holds slot {slot} under a different key")
        if slot is not None:
            seen.add(slot)
    return _count_gate("blind_retries", "blind retries", offenders, n, note="LOCAL payment attempts checked")
