"""Policy modes and rollout (SPEC §15): whether a decision may change access or send messages.

The stage in force for a policy and a cohort is the newest `RolloutStage` row for (policy, cohort)
or (policy, "*"); without one it is the document's own `mode` and `rollout` (its initial stage).
Reading it is one indexed query; callers looping over many rows (the gates) memoise it with
`StageMemo`. A subscription is in a rollout when its deterministic bucket is under the stage's
percentage and, for a partial (< 100 %) rollout, it meets the policy's low-risk criterion.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Exists, OuterRef, Q

from dunning.clock import trusted_now
from dunning.models import DunningCycle, FactKind, MonetaryFact, RolloutStage
from dunning.policy.document import PolicyDocument
from dunning.policy.low_risk import LowRisk
from subscriptions.models import Subscription

MODE_ORDER = ("SHADOW", "NOTIFY_ONLY", "ENFORCE")
# How a receipt says a decision was computed but not applied (SHADOW, NOTIFY_ONLY, outside the rollout).
SHADOW_DECISION = "decision recorded, access unchanged"
DISPUTE_KINDS = (FactKind.DISPUTE_OPENED, FactKind.DISPUTE_WON, FactKind.DISPUTE_LOST)


@dataclass(frozen=True)
class Stage:
    """The mode and percentage in force; `stage_id` None means the document's initial stage."""

    mode: str
    percent: int
    covers_cohort: bool
    stage_id: int | None = None
    started_at: datetime | None = None


def rollout_bucket(subscription_key: str, cohort: str) -> int:
    """Deterministic 0..99 bucket per subscription, so a rollout percentage is stable."""
    digest = hashlib.sha256(f"{cohort}:{subscription_key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % 100


def effective_stage(spec: PolicyDocument, cohort: str) -> Stage:
    """One indexed read: the newest stage row for this policy and cohort (or "*")."""
    row = (RolloutStage.objects.filter(policy__identity=spec.identity, cohort__in=(cohort, "*"))
           .order_by("-started_at", "-id").values_list("pk", "mode", "percent", "started_at").first())
    return stage_from_row(spec, cohort, row)


def stage_from_row(spec: PolicyDocument, cohort: str, row: Sequence[Any] | None) -> Stage:
    """The stage a (pk, mode, percent, started_at) stage row names; the policy's own without one.
    The acceptance transaction reads the row in its own statement (dunning.acceptance.locked_read)."""
    if row is None:
        return Stage(mode=spec.mode, percent=spec.rollout_percent, covers_cohort=spec.rollout_cohort in ("*", cohort))
    pk, mode, percent, started_at = row
    return Stage(mode=mode, percent=percent, covers_cohort=True, stage_id=pk, started_at=started_at)


class StageMemo:
    """Stages read once per (policy, cohort) for one pass over many rows (a gates evaluation)."""

    def __init__(self) -> None:
        self._stages: dict[tuple[str, str], Stage] = {}

    def __call__(self, spec: PolicyDocument, cohort: str) -> Stage:
        key = (spec.identity, cohort)
        if key not in self._stages:
            self._stages[key] = effective_stage(spec, cohort)
        return self._stages[key]


def meets_low_risk(criterion: LowRisk | None, subscription_pk: int | None, now: datetime | None = None) -> bool:
    """Whether the subscription meets the policy's low-risk criterion (one query; True without
    one). Without a subscription id the criterion cannot be checked, so it is not met."""
    if criterion is None:
        return True
    if subscription_pk is None:
        return False
    subs = Subscription.objects.filter(pk=subscription_pk)
    if criterion.min_tenure_days is not None:
        since = (now or trusted_now()) - timedelta(days=criterion.min_tenure_days)
        subs = subs.filter(created_at__lte=since)
    if criterion.max_amount_minor is not None:
        subs = subs.exclude(invoices__amount_due__gt=criterion.max_amount_minor)
    if criterion.no_disputes:
        disputes = MonetaryFact.objects.filter(invoice__subscription=OuterRef("pk"), kind__in=DISPUTE_KINDS)
        subs = subs.filter(~Exists(disputes))
    if criterion.no_conflicts:
        conflicts = DunningCycle.objects.filter(Q(state="EVIDENCE_CONFLICT") | ~Q(conflict_reason=""),
                                                subscription=OuterRef("pk"))
        subs = subs.filter(~Exists(conflicts))
    return subs.exists()


def in_rollout(spec: PolicyDocument, *, subscription_key: str, cohort: str, subscription_pk: int | None = None,
               now: datetime | None = None, stage: Stage | None = None) -> bool:
    stage = stage or effective_stage(spec, cohort)
    if not stage.covers_cohort or rollout_bucket(subscription_key, cohort) >= stage.percent:
        return False
    return stage.percent >= 100 or meets_low_risk(spec.rollout_low_risk, subscription_pk, now)


def enforces_access(spec: PolicyDocument, *, subscription_key: str, cohort: str, subscription_pk: int | None = None,
                    now: datetime | None = None, stage: Stage | None = None) -> bool:
    stage = stage or effective_stage(spec, cohort)
    return stage.mode == "ENFORCE" and in_rollout(spec, subscription_key=subscription_key, cohort=cohort,
                                                  subscription_pk=subscription_pk, now=now, stage=stage)


def sends_notifications(spec: PolicyDocument, *, subscription_key: str, cohort: str,
                        subscription_pk: int | None = None, now: datetime | None = None,
                        stage: Stage | None = None) -> bool:
    stage = stage or effective_stage(spec, cohort)
    if stage.mode == "SHADOW":
        return False
    return in_rollout(spec, subscription_key=subscription_key, cohort=cohort, subscription_pk=subscription_pk,
                      now=now, stage=stage)
