"""The contract line on the clock (SPEC §7): a contract set to cancel at its period end, one
whose end date passed, and a pause whose resume time passed change what access allows without
any new provider event. This job asks the provider fresh and applies its answer; when the
provider cannot be reached, access is still recomputed from the contract as last fetched (the
deadline is in that evidence) and the fetch is tried again next run.
"""

from __future__ import annotations

from django.db.models import Q

from dunning.acceptance.inputs import Cause
from dunning.acceptance.subscription import subscription_accept_change
from dunning.claims import claim
from dunning.evidence.subscription_import import ContractRefused, subscription_import
from dunning.jobs.framework import JobReport, due_in_order, scheduled_job
from dunning.policy.vocabulary import ENDED_CONTRACT_STATES
from subscriptions.models import Subscription
from subscriptions.providers.base import ProviderError
from subscriptions.providers.registry import get_provider

JOB = "contract_deadlines"


def due_contracts(now):  # noqa: ANN001, ANN201 - a Subscription queryset
    ending = (Q(cancel_at_period_end=True, current_period_end__lte=now) | Q(contract_ended_at__lte=now))
    resuming = Q(contract_phase="paused", pause_resumes_at__lte=now)
    return Subscription.objects.filter((ending & ~Q(contract_phase__in=ENDED_CONTRACT_STATES)) | resuming)


@scheduled_job(JOB, "contracts past their period end (cancel at period end), end date or pause resume time: "
                    "fetch fresh and recompute access; never FULL on an ended contract")
def contract_deadlines(run: JobReport) -> None:
    for pk in due_in_order(due_contracts(run.now), "pk"):
        run.examined += 1
        run.tick()
        with claim("contract", pk) as got:
            if got:
                _recheck(run, pk)


def _recheck(run: JobReport, pk: int) -> None:
    sub = Subscription.objects.get(pk=pk)
    cause = Cause.job(run.job)
    before = (sub.contract_phase, sub.entitlement_generation)
    try:
        subscription_import(get_provider(sub.provider).fetch_subscription(sub.provider_subscription_id),
                            cause=cause, now=run.now)
    except ContractRefused as refused:
        run.note(f"subscription {sub.provider_subscription_id}: fresh read not applied: {refused}")
    except ProviderError as exc:
        run.errors += 1
        run.note(f"subscription {sub.provider_subscription_id}: fetch failed, deciding on the contract as last "
                 f"fetched: {exc}")
    sub.refresh_from_db()
    if due_contracts(run.now).filter(pk=pk).exists():
        result = subscription_accept_change(subscription_pk=pk, change="contract_recheck", cause=cause, now=run.now,
                                            expect_contract_revision=sub.contract_revision)
        if not result.accepted:
            run.refused += 1
            run.note(f"subscription {sub.provider_subscription_id}: contract_recheck refused: {result.reason}")
        sub.refresh_from_db()
    if (sub.contract_phase, sub.entitlement_generation) != before:
        run.changed += 1
