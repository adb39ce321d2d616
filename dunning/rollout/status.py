"""Where each policy's rollout stands, per cohort: mode, percentage, how long it has run.

Running time is counted as **elapsed billing periods**: whole calendar months (or years, for a
cohort billed yearly) since the stage began — the document's stage began when the policy was
published. The number of dunning cycles opened under the stage is shown beside it.

The gates (dunning.gates) are evaluated over every stored row, so a green report covers the
window too; a red one blocks a promotion even when the offence predates the window (the safe side).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings

from dunning.clock import trusted_now
from dunning.gates import GatesReport, gates_evaluate
from dunning.models import DunningCycle, DunningPolicy, RolloutStage
from dunning.policy.cache import policy_spec
from dunning.policy.rollout import Stage, effective_stage
from subscriptions.models import Subscription

DEFAULT_SHADOW_CYCLES = 2


def shadow_window_cycles() -> int:
    """Billing cycles a policy runs in SHADOW before it may leave it (seed 001: two)."""
    return int(getattr(settings, "DUNNING_ROLLOUT_SHADOW_CYCLES", DEFAULT_SHADOW_CYCLES))


def elapsed_periods(start: datetime, now: datetime, interval: str) -> int:
    """Whole billing periods between start and now (calendar months, or years when yearly)."""
    months = (now.year - start.year) * 12 + (now.month - start.month)
    if (now.day, now.time()) < (start.day, start.time()):
        months -= 1
    months = max(months, 0)
    return months // 12 if interval == "year" else months


@dataclass(frozen=True)
class RolloutRow:
    policy_id: int
    policy: str
    cohort: str
    mode: str
    percent: int
    stage_id: int | None
    since: datetime
    interval: str
    periods_elapsed: int
    cycles_opened: int
    subscriptions: int
    low_risk: str
    shadow_window: int
    gates_passed: bool | None  # None: not evaluated for this view
    failed_gates: tuple[str, ...] = field(default=())

    @property
    def source(self) -> str:
        return f"stage #{self.stage_id}" if self.stage_id else "policy document"

    @property
    def shadow_window_met(self) -> bool:
        return self.periods_elapsed >= self.shadow_window


def stage_start(policy: DunningPolicy, stage: Stage) -> datetime:
    return stage.started_at or policy.published_at


def cohort_interval(policy: DunningPolicy, cohort: str) -> str:
    subs = Subscription.objects.filter(policy=policy)
    if cohort != "*":
        subs = subs.filter(cohort=cohort)
    counts = Counter(subs.values_list("billing_interval", flat=True).order_by()[:1000])
    return counts.most_common(1)[0][0] if counts else "month"


def row_for(policy: DunningPolicy, cohort: str, now: datetime, gates: GatesReport | None) -> RolloutRow:
    spec = policy_spec(policy)
    stage = effective_stage(spec, cohort)
    since = stage_start(policy, stage)
    interval = cohort_interval(policy, cohort)
    subs = Subscription.objects.filter(policy=policy)
    cycles = DunningCycle.objects.filter(policy=policy, opened_at__gte=since, opened_at__lte=now)
    if cohort != "*":
        subs, cycles = subs.filter(cohort=cohort), cycles.filter(subscription__cohort=cohort)
    return RolloutRow(
        policy_id=policy.pk, policy=policy.identity, cohort=cohort, mode=stage.mode, percent=stage.percent,
        stage_id=stage.stage_id, since=since, interval=interval, periods_elapsed=elapsed_periods(since, now, interval),
        cycles_opened=cycles.count(), subscriptions=subs.count(),
        low_risk=spec.rollout_low_risk.describe() if spec.rollout_low_risk else "everyone in the bucket",
        shadow_window=shadow_window_cycles(), gates_passed=gates.passed if gates else None,
        failed_gates=tuple(g.key for g in gates.failed) if gates else (),
    )


def policy_cohorts() -> list[tuple[DunningPolicy, str]]:
    """Every (policy, cohort) pair worth showing: cohorts bound to the policy, cohorts it has a
    stage for, else the cohort its document rolls out to."""
    bound: dict[int, set[str]] = {}
    for policy_id, cohort in Subscription.objects.values_list("policy_id", "cohort").distinct().order_by():
        bound.setdefault(policy_id, set()).add(cohort)
    for policy_id, cohort in RolloutStage.objects.values_list("policy_id", "cohort").distinct().order_by():
        bound.setdefault(policy_id, set()).add(cohort)
    pairs = []
    for policy in DunningPolicy.objects.order_by("name", "-version"):
        cohorts = bound.get(policy.pk) or {policy_spec(policy).rollout_cohort}
        pairs.extend((policy, cohort) for cohort in sorted(cohorts))
    return pairs


def rollout_status(now: datetime | None = None, *, evaluate_gates: bool = True) -> list[RolloutRow]:
    """One row per (policy, cohort). The gates are evaluated once for all rows (they are global);
    `evaluate_gates=False` leaves the verdict out (a page showing the table without the cost)."""
    now = now or trusted_now()
    gates = gates_evaluate(now=now) if evaluate_gates else None
    return [row_for(policy, cohort, now, gates) for policy, cohort in policy_cohorts()]
