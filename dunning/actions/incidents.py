"""The incident switch (SPEC §11, §15): pause new restrictions, roll a cohort back to the
previous policy version, and leave the incident with a fresh entitlement generation.

None of this touches invoices, attempts or money facts: an incident never fakes a payment.
Every subscription-level write goes through the acceptance service.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from dunning.acceptance.inputs import Cause
from dunning.acceptance.subscription import subscription_accept_change
from dunning.clock import trusted_now
from dunning.models import DunningPolicy, IncidentSwitch
from dunning.policy.cache import policy_spec
from dunning.policy.permissiveness import describe, most_permissive_not_stricter
from dunning.policy.publishing import policy_provider
from subscriptions.models import Subscription


class IncidentError(ValueError):
    """A request the incident switch cannot carry out; the message says why."""


@dataclass
class CohortOutcome:
    changed: int = 0
    refused: list[str] = field(default_factory=list)


def _require_reason(reason: str, ticket: str) -> None:
    if not reason.strip() or not ticket.strip():
        raise IncidentError("an incident decision needs a reason and a ticket reference")


def incident_start(*, user: Any, reason: str, ticket: str, cohort: str = "*",
                   now: datetime | None = None) -> IncidentSwitch:
    _require_reason(reason, ticket)
    if IncidentSwitch.objects.filter(ended_at__isnull=True, cohort=cohort).exists():
        raise IncidentError(f"an incident already pauses restrictions for cohort {cohort!r}")
    return IncidentSwitch.objects.create(cohort=cohort, reason=reason, ticket=ticket, started_by=user,
                                         started_at=now or trusted_now())


def _subscriptions_in(cohort: str):  # noqa: ANN202 - QuerySet[Subscription]
    subs = Subscription.objects.all() if cohort == "*" else Subscription.objects.filter(cohort=cohort)
    return subs.order_by("pk")


def incident_end(*, switch: IncidentSwitch, user: Any, reason: str = "incident ended",
                 now: datetime | None = None, progress: Callable[[str], None] | None = None) -> CohortOutcome:
    """End the pause and issue every subscription of the cohort a new entitlement generation,
    so caches and runtime services re-read access decided under normal rules again."""
    if switch.ended_at is not None:
        raise IncidentError(f"incident {switch.ticket} already ended {switch.ended_at.isoformat()}")
    now = now or trusted_now()
    switch.ended_at, switch.ended_by = now, user
    switch.save(update_fields=["ended_at", "ended_by"])
    cause = Cause.staff(user, reason=reason, ticket=switch.ticket)
    out = CohortOutcome()
    for n, (pk, root) in enumerate(_subscriptions_in(switch.cohort).values_list("pk", "outstanding_cycle_root")
                                   .iterator(chunk_size=1000), start=1):
        result = subscription_accept_change(subscription_pk=pk, change="reissue_entitlement", expect_root=root,
                                            cause=cause, now=now)
        _count(out, pk, result)
        if progress and n % 1000 == 0:
            progress(f"reissued {n} subscriptions")
    return out


def previous_policy_version(policy: DunningPolicy) -> DunningPolicy:
    """The rollback target: the MORE PERMISSIVE earlier version of `policy`, comparing the documents
    (grace, restricted profile, cancellation timing; see dunning.policy.permissiveness), not simply
    version - 1. An earlier version stricter on any axis is never chosen, nor one stating another
    provider (a rollback stays with the provider that collects the subscriptions)."""
    provider = policy_provider(policy)[0]
    same_name = DunningPolicy.objects.filter(name=policy.name, version__lt=policy.version).order_by("-version")
    earlier = [p for p in same_name if policy_provider(p)[0] == provider]
    if not earlier:
        raise IncidentError(f"{policy.identity} has no previous version to roll back to among {provider} policies")
    current = policy_spec(policy)
    chosen = most_permissive_not_stricter(current, ((policy_spec(p), p) for p in earlier))
    if chosen is None:
        raise IncidentError(f"no previous version of {policy.identity} is at least as permissive "
                            f"({describe(current)}); every earlier one is stricter somewhere")
    return chosen


def cohort_rebind_to_previous(*, policy: DunningPolicy, cohort: str, user: Any, reason: str, ticket: str,
                              now: datetime | None = None) -> CohortOutcome:
    """Bind every subscription of `cohort` now on `policy` to the version published before it."""
    _require_reason(reason, ticket)
    target = previous_policy_version(policy)
    now = now or trusted_now()
    cause = Cause.staff(user, reason=reason, ticket=ticket)
    out = CohortOutcome()
    subs = _subscriptions_in(cohort).filter(policy=policy)
    for pk, root in subs.values_list("pk", "outstanding_cycle_root").iterator(chunk_size=1000):
        result = subscription_accept_change(subscription_pk=pk, change="rebind_policy", expect_root=root,
                                            cause=cause, policy_pk=target.pk, now=now)
        _count(out, pk, result)
    return out


def _count(out: CohortOutcome, pk: int, result: Any) -> None:
    if result.accepted:
        out.changed += 1
    else:
        out.refused.append(f"subscription {pk}: {result.reason}")
