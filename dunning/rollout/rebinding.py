"""Moving a cohort between policy versions, cohort-wide, through the subscription aggregate's
acceptance (one compare-and-set and one transition receipt per subscription; never a payment fact).

- `rollout_rollback`: back to the MORE PERMISSIVE earlier version of each policy bound in the
  cohort (dunning.actions.incidents.previous_policy_version); open cycles move with it, so the
  kinder grace applies to debts already open.
- `rollout_rebind_forward`: on to a newer version, as a recorded job (a JobRun whose counts move
  after every batch). Open cycles keep the policy they were opened under. Each subscription is
  fenced on its root and on the policy it was read with, so a concurrent change makes it refuse,
  not overwrite; a re-run (after a crash, or to pick up the refused) visits only the subscriptions
  still on an older version, so it is idempotent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import transaction

from dunning.acceptance.inputs import Cause
from dunning.acceptance.subscription import subscription_accept_change
from dunning.actions.incidents import IncidentError, incident_start, previous_policy_version
from dunning.clock import trusted_now
from dunning.jobs.framework import worker_name
from dunning.models import DunningPolicy, IncidentSwitch, JobRun
from dunning.policy.publishing import policy_provider
from dunning.rollout.errors import RolloutError, require_lead
from dunning.rollout.promotion import resolve_policy
from subscriptions.models import Subscription

REBIND_JOB = "rollout_rebind_forward"
Progress = Callable[[str], None]


@dataclass
class PolicyMove:
    from_policy: str
    to_policy: str
    changed: int = 0
    refused: list[str] = field(default_factory=list)


@dataclass
class RollbackOutcome:
    moves: list[PolicyMove] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # policies with no kinder earlier version
    incident: IncidentSwitch | None = None

    @property
    def changed(self) -> int:
        return sum(m.changed for m in self.moves)


def _in_cohort(cohort: str):  # noqa: ANN202 - QuerySet[Subscription]
    return Subscription.objects.all() if cohort == "*" else Subscription.objects.filter(cohort=cohort)


def rollout_rollback(*, cohort: str, by: Any, reason: str, ticket: str, now: datetime | None = None,
                     pause_restrictions: bool = False) -> RollbackOutcome:
    """Rebind every subscription of `cohort` to the more permissive earlier version of its policy
    (optionally pausing new restrictions for the cohort first, as during an incident). Refused
    with nothing changed when the cohort has no subscriptions or no policy in it has a kinder
    earlier version."""
    require_lead(by, reason, ticket)
    cohort = (cohort or "").strip()
    now = now or trusted_now()
    bound = list(DunningPolicy.objects.filter(pk__in=_in_cohort(cohort).values("policy_id")).order_by("pk"))
    if not bound:
        raise RolloutError("EMPTY_COHORT", f"no subscription is in cohort {cohort!r}")
    outcome, targets = RollbackOutcome(), {}
    for policy in bound:
        try:
            targets[policy.pk] = previous_policy_version(policy)
        except IncidentError as exc:
            outcome.kept.append(str(exc))
    if not targets:
        raise RolloutError("NO_PERMISSIVE_PREVIOUS", "; ".join(outcome.kept))
    if pause_restrictions and not IncidentSwitch.objects.filter(ended_at__isnull=True, cohort=cohort).exists():
        outcome.incident = incident_start(user=by, reason=reason, ticket=ticket, cohort=cohort, now=now)
    cause = Cause.staff(by, reason=reason, ticket=ticket)
    for policy in bound:
        if policy.pk not in targets:
            continue
        move = PolicyMove(from_policy=policy.identity, to_policy=targets[policy.pk].identity)
        subs = _in_cohort(cohort).filter(policy=policy).order_by("pk")
        for pk, root in subs.values_list("pk", "outstanding_cycle_root").iterator(chunk_size=1000):
            result = subscription_accept_change(subscription_pk=pk, change="rebind_policy", expect_root=root,
                                                expect_policy_pk=policy.pk, cause=cause,
                                                policy_pk=targets[policy.pk].pk, now=now)
            if result.accepted:
                move.changed += 1
            else:
                move.refused.append(f"subscription {pk}: {result.reason}")
        outcome.moves.append(move)
    return outcome


def rebind_forward_check(*, cohort: str, to_policy: DunningPolicy | str | int, by: Any, reason: str, ticket: str,
                         batch: int = 500) -> tuple[DunningPolicy, str]:
    """Everything a forward rebind is refused for, checked before it starts (or is queued)."""
    target = resolve_policy(to_policy)
    require_lead(by, reason, ticket)
    cohort = (cohort or "").strip()
    if not cohort:
        raise RolloutError("COHORT_REQUIRED", 'name a cohort, or "*" for every cohort')
    if batch < 1:
        raise RolloutError("BAD_BATCH", f"batch must be at least 1, got {batch}")
    return target, cohort


def rollout_rebind_forward_request(*, cohort: str, to_policy: DunningPolicy | str | int, by: Any, reason: str,
                                   ticket: str, enqueue: Callable[..., Any], batch: int = 500) -> DunningPolicy:
    """The admin's way in: refuse now (nothing queued) or hand the rebind to `enqueue` (the Celery
    task's `.delay`) after commit; the page follows its JobRun's counts as they move."""
    target, cohort = rebind_forward_check(cohort=cohort, to_policy=to_policy, by=by, reason=reason, ticket=ticket,
                                          batch=batch)
    transaction.on_commit(lambda: enqueue(cohort=cohort, policy_pk=target.pk, user_pk=by.pk, reason=reason,
                                          ticket=ticket, batch=batch))
    return target


def rollout_rebind_forward(*, cohort: str, to_policy: DunningPolicy | str | int, by: Any, reason: str,
                           ticket: str, now: datetime | None = None, batch: int = 500,
                           progress: Progress | None = None) -> JobRun:
    """Bind every subscription of `cohort` on an older version of `to_policy`'s name to it, for new
    cycles only. Returns the finished JobRun (examined / changed / refused, refusals in detail)."""
    target, cohort = rebind_forward_check(cohort=cohort, to_policy=to_policy, by=by, reason=reason, ticket=ticket,
                                          batch=batch)
    now = now or trusted_now()
    # Only subscriptions collected through the target's provider (binding refuses the others anyway).
    older = _in_cohort(cohort).filter(policy__name=target.name, policy__version__lt=target.version,
                                      provider=policy_provider(target)[0])
    run = JobRun.objects.create(job=REBIND_JOB, run_for=now, started_at=trusted_now(), worker=worker_name(),
                                detail=f"cohort {cohort!r} → {target.identity} ({ticket})")
    cause = Cause.staff(by, reason=reason, ticket=ticket)
    counts, refusals, last = {"examined": 0, "changed": 0, "refused": 0}, [], 0
    try:
        while True:
            page = list(older.filter(pk__gt=last).order_by("pk")
                        .values_list("pk", "outstanding_cycle_root", "policy_id")[:batch])
            if not page:
                break
            for pk, root, policy_id in page:
                result = subscription_accept_change(
                    subscription_pk=pk, change="rebind_policy_forward", expect_root=root,
                    expect_policy_pk=policy_id, policy_pk=target.pk, cause=cause, now=now)
                counts["examined"] += 1
                counts["changed" if result.accepted else "refused"] += 1
                if not result.accepted and len(refusals) < 200:
                    refusals.append(f"subscription {pk}: {result.reason} {result.detail}".strip())
            last = page[-1][0]
            _record_progress(run, counts, refusals, "RUNNING")
            if progress:
                progress(f"{REBIND_JOB}: {counts['examined']} examined, {counts['changed']} rebound, "
                         f"{counts['refused']} refused")
    except Exception as exc:
        _record_progress(run, counts, [*refusals, f"failed: {exc!r}"], "FAILED", finished=True)
        raise
    _record_progress(run, counts, refusals, "PARTIAL" if counts["refused"] else "OK", finished=True)
    return run


def _record_progress(run: JobRun, counts: dict[str, int], refusals: list[str], status: str, *,
                     finished: bool = False) -> None:
    run.examined, run.changed, run.refused = counts["examined"], counts["changed"], counts["refused"]
    run.status = status
    header = run.detail.split("\n", 1)[0]
    run.detail = "\n".join([header, *refusals])[:20000]
    fields = ["examined", "changed", "refused", "status", "detail"]
    if finished:
        run.finished_at = trusted_now()
        fields.append("finished_at")
    run.save(update_fields=fields)
