"""Gates of the contract line and the grace deadline: grace overrun, ended-contract access."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import F, Q

from dunning.acceptance.contract import ContractView, contract_phase, is_ended
from dunning.jobs.schedule import JOB_CADENCE
from dunning.models import DunningCycle
from dunning.policy.rollout import enforces_access
from dunning.policy.vocabulary import ENDED_CONTRACT_STATES
from dunning.states import GRACE_DEADLINE_STATES, PENDING_ATTEMPT_STATES
from entitlements.models import EntitlementSnapshot
from entitlements.profiles import FULL
from subscriptions.models import Subscription

from .definitions import BATCH
from .report import Gate, _count_gate, _Offenders, _PolicySpecs


def job_period(job: str) -> timedelta:
    return timedelta(seconds=JOB_CADENCE[job])


def grace_overruns(now: datetime):  # noqa: ANN201 - a DunningCycle queryset
    """Cycles still in a grace state more than one grace_expiry period after their deadline with
    no attempt in flight (a prepared, dispatched or unknown attempt holds the expiry)."""
    late = now - job_period("grace_expiry")
    return (DunningCycle.objects.filter(state__in=GRACE_DEADLINE_STATES, grace_expires_at__lt=late)
            .exclude(pending_attempt__state__in=PENDING_ATTEMPT_STATES))


def _gate_grace_overrun(now: datetime) -> Gate:
    """See GATE_DEFINITIONS["grace_overrun"]."""
    offenders = _Offenders()
    checked = DunningCycle.objects.filter(state__in=GRACE_DEADLINE_STATES).count()
    for cycle_id, state, expires in grace_overruns(now).order_by("grace_expires_at").values_list(
            "cycle_id", "state", "grace_expires_at").iterator(chunk_size=BATCH):
        offenders.add(cycle_id, f"{state}, grace ended {expires.isoformat()}")
    return _count_gate("grace_overrun", "grace past its deadline (+1 job period), no attempt in flight",
                       offenders, checked)


def ended_contracts(now: datetime):  # noqa: ANN201 - a Subscription queryset
    """Contracts ended (or past the end they were set to cancel at) before one contract_deadlines
    period ago: by then no FULL access may remain."""
    settled = now - job_period("contract_deadlines")
    return Subscription.objects.filter(
        Q(provider_status__in=ENDED_CONTRACT_STATES) | Q(contract_ended_at__lte=settled)
        | Q(cancel_at_period_end=True, current_period_end__lte=settled))


def _gate_ended_contract_access(now: datetime, specs: _PolicySpecs) -> Gate:
    """See GATE_DEFINITIONS["ended_contract_access"]."""
    offenders = _Offenders()
    checked = 0
    for sub in ended_contracts(now).order_by("pk").iterator(chunk_size=BATCH):
        checked += 1
        spec = specs[sub.policy_id]
        if not enforces_access(spec, subscription_key=sub.provider_subscription_id, cohort=sub.cohort,
                               subscription_pk=sub.pk, now=now, stage=specs.stage(spec, sub.cohort)):
            continue
        if sub.entitlement_profile == FULL and is_ended(contract_phase(ContractView.of(sub), now)):
            offenders.add(sub.provider_subscription_id, "FULL now on an ended contract")
    late_full = (EntitlementSnapshot.objects.filter(profile=FULL, subscription__contract_ended_at__isnull=False,
                                                    issued_at__gt=F("subscription__contract_ended_at"))
                 .values_list("subscription__provider_subscription_id", "generation", "issued_at"))
    for key, generation, issued_at in late_full.iterator(chunk_size=BATCH):
        checked += 1
        offenders.add(key, f"FULL generation {generation} issued {issued_at.isoformat()} after the contract ended")
    return _count_gate("ended_contract_access", "FULL access on an ended contract", offenders, checked)
