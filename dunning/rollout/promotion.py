"""Promoting (or stepping back) a policy's rollout stage for a cohort: one append-only
RolloutStage per decision, refused with a coded RolloutError when it may not happen."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction

from dunning.clock import trusted_now
from dunning.gates import gates_evaluate
from dunning.models import DunningPolicy, RolloutStage
from dunning.policy.cache import policy_spec
from dunning.policy.rollout import MODE_ORDER, effective_stage
from dunning.rollout.errors import RolloutError, require_lead
from dunning.rollout.status import row_for


def resolve_policy(policy: DunningPolicy | str | int) -> DunningPolicy:
    """A policy given as a row, its identity (name@version) or its id; UNKNOWN_POLICY otherwise."""
    if isinstance(policy, DunningPolicy):
        return policy
    found = None
    if isinstance(policy, int) or (isinstance(policy, str) and policy.isdigit()):
        found = DunningPolicy.objects.filter(pk=int(policy)).first()
    elif isinstance(policy, str):
        found = DunningPolicy.objects.filter(identity=policy.strip()).first()
    if found is None:
        raise RolloutError("UNKNOWN_POLICY", f"no published policy {policy!r}")
    return found


def parse_percent(percent: Any) -> int:
    try:
        value = int(str(percent).strip())
    except (TypeError, ValueError):
        raise RolloutError("PERCENT_OUT_OF_RANGE", f"percent must be a whole number from 0 to 100, got {percent!r}"
                           ) from None
    if not 0 <= value <= 100 or str(percent).strip() not in (str(value), f"+{value}"):
        raise RolloutError("PERCENT_OUT_OF_RANGE", f"percent must be a whole number from 0 to 100, got {percent!r}")
    return value


def rollout_promote(*, policy: DunningPolicy | str | int, cohort: str, to_mode: str, percent: Any, by: Any,
                    reason: str, ticket: str, now: datetime | None = None) -> RolloutStage:
    """Move (policy, cohort) to `to_mode` at `percent` %.

    Refused, with nothing changed: an unknown policy or mode, a percent outside 0..100, a missing
    reason or ticket, a user who is not a billing lead, a forward jump that skips a mode (SHADOW →
    NOTIFY_ONLY → ENFORCE), a promotion out of SHADOW before the shadow window has run, and any
    widening (a later mode or a larger percent) while the gates are red. Stepping back (an
    earlier mode, a smaller percent) is always allowed: it only enforces less."""
    now = now or trusted_now()
    target = resolve_policy(policy)
    cohort = (cohort or "").strip()
    if not cohort:
        raise RolloutError("COHORT_REQUIRED", 'name a cohort, or "*" for every cohort')
    if to_mode not in MODE_ORDER:
        raise RolloutError("UNKNOWN_MODE", f"unknown mode {to_mode!r}; expected {', '.join(MODE_ORDER)}")
    percent = parse_percent(percent)
    require_lead(by, reason, ticket)
    with transaction.atomic():
        # One promotion per policy at a time: the policy row is the lock (it is never updated).
        DunningPolicy.objects.select_for_update().filter(pk=target.pk).first()
        current = effective_stage(policy_spec(target), cohort)
        step = MODE_ORDER.index(to_mode) - MODE_ORDER.index(current.mode)
        if step == 0 and percent == current.percent:
            raise RolloutError("NO_CHANGE", f"{target.identity} is already {to_mode} at {percent} % for {cohort!r}")
        if step > 1:
            skipped = MODE_ORDER[MODE_ORDER.index(current.mode) + 1]
            raise RolloutError("SKIPS_A_MODE", f"{current.mode} → {to_mode} skips {skipped}; "
                               "the order is SHADOW → NOTIFY_ONLY → ENFORCE")
        evidence: dict[str, Any] = {"from": {"mode": current.mode, "percent": current.percent,
                                             "stage": current.stage_id}}
        if step > 0 or (step == 0 and percent > current.percent):
            gates = gates_evaluate(now=now)
            row = row_for(target, cohort, now, gates)
            evidence.update(gates={"passed": gates.passed, "failed": [g.key for g in gates.failed],
                                   "evaluated_at": gates.evaluated_at.isoformat()},
                            window={"since": row.since.isoformat(), "periods_elapsed": row.periods_elapsed,
                                    "interval": row.interval, "required": row.shadow_window,
                                    "cycles_opened": row.cycles_opened})
            if current.mode == "SHADOW" and step > 0 and not row.shadow_window_met:
                raise RolloutError("SHADOW_WINDOW_NOT_MET", f"{target.identity} has run {row.periods_elapsed} of "
                                   f"{row.shadow_window} billing cycles ({row.interval}ly) in SHADOW since "
                                   f"{row.since:%Y-%m-%d}")
            if not gates.passed:
                raise RolloutError("GATES_RED", "the release gates are not green: "
                                   + ", ".join(g.key for g in gates.failed))
        return RolloutStage.objects.create(
            policy=target, cohort=cohort, mode=to_mode, percent=percent, previous_mode=current.mode,
            previous_percent=current.percent, started_at=now, started_by=by, reason=reason.strip(),
            ticket=ticket.strip(), evidence=evidence)
