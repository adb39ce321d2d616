"""Generation gate: stale-generation commits of cycle receipts and entitlement snapshots."""

from __future__ import annotations

from django.db.models import BigIntegerField, F, IntegerField, OuterRef, Subquery, Window
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast, Lag

from dunning.models import TransitionReceipt
from dunning.states import TERMINAL_STATES
from entitlements.models import EntitlementSnapshot
from subscriptions.models import Subscription

from .definitions import DETAIL_LIMIT, NON_MOVING_EDGES
from .report import Gate, _count_gate, _Offenders


def _moving_cycle_receipts():
    return (TransitionReceipt.objects.filter(accepted=True, cycle__isnull=False, cycle_generation__isnull=False)
            .exclude(edge__in=NON_MOVING_EDGES).exclude(from_state__in=TERMINAL_STATES))


def _gate_stale_generation_commits() -> Gate:
    """See GATE_DEFINITIONS["stale_generation_commits"]."""
    offenders = _Offenders()
    moving = _moving_cycle_receipts()
    previous = Window(Lag("cycle_generation"), partition_by=[F("cycle_id")], order_by=[F("pk").asc()])
    not_increasing = moving.annotate(previous=previous).filter(previous__gte=F("cycle_generation"))
    offenders.extend(not_increasing.count(),
                     [f"receipt {pk} cycle {c} generation {g}" for pk, c, g in not_increasing.order_by("pk")
                      .values_list("pk", "cycle__cycle_id", "cycle_generation")[:DETAIL_LIMIT]],
                     "cycle generation not above the previous accepted move")
    expected = Cast(KeyTextTransform("cycle_generation", "expected"), BigIntegerField())
    off_cas = (moving.annotate(expected_generation=expected)
               .filter(expected_generation__isnull=False)
               .exclude(cycle_generation=F("expected_generation") + 1))
    offenders.extend(off_cas.count(),
                     [f"receipt {pk} cycle {c} expected {e} committed {g}" for pk, c, e, g in off_cas.order_by("pk")
                      .values_list("pk", "cycle__cycle_id", "expected_generation", "cycle_generation")[:DETAIL_LIMIT]],
                     "committed generation is not the expected one + 1")
    snapshot_previous = Window(Lag("generation"), partition_by=[F("subscription_id")],
                               order_by=[F("issued_at").asc(), F("pk").asc()])
    snapshots = (EntitlementSnapshot.objects.annotate(previous=snapshot_previous)
                 .filter(previous__gte=F("generation")))
    offenders.extend(snapshots.count(),
                     [f"{s}@{g}" for s, g in snapshots.order_by("pk")
                      .values_list("subscription__provider_subscription_id", "generation")[:DETAIL_LIMIT]],
                     "snapshot generation not above the previously issued one")
    newest = Subquery(EntitlementSnapshot.objects.filter(subscription_id=OuterRef("pk")).order_by("-generation")
                      .values("generation")[:1], output_field=IntegerField())
    behind = Subscription.objects.annotate(newest=newest).filter(entitlement_generation__lt=F("newest"))
    offenders.extend(behind.count(),
                     [f"{s} stored {g} newest {n}" for s, g, n in behind.order_by("pk")
                      .values_list("provider_subscription_id", "entitlement_generation", "newest")[:DETAIL_LIMIT]],
                     "stored generation below the newest snapshot")
    checked = moving.count() + EntitlementSnapshot.objects.count()
    return _count_gate("stale_generation_commits", "stale-generation commits", offenders, checked,
                       note="accepted cycle moves and entitlement snapshots checked")
