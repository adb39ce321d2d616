"""Loading a subscription's review input from the database (SPEC §14) and judging it.

``subscription_review`` reads everything the pure evaluator in :mod:`dunning.reads.verdicts` needs in a
fixed number of queries, whatever the number of cycles:

1. the subscription with its bound policy;
2. its cycles with their invoice mirror and own policy;
3. per cycle, the latest accepted transition receipt (the audit ref) and the latest accepted
   receipt that settled it (RECOVERED / CLOSED_VOID), in one aggregate;
4. the ``notification.requested`` outbox rows of the subscription.

``subscription_verdict`` is the one-call form used by the admin, the API and tests.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import F, Max, Q

from dunning.acceptance.aggregate import aggregate_decision
from dunning.acceptance.guards import attempts_made
from dunning.acceptance.settlement import cycle_view, with_contract
from dunning.clock import trusted_now
from dunning.models import DunningCycle, DunningPolicy, OutboxMessage, TransitionReceipt
from dunning.policy.cache import policy_spec
from dunning.policy.rollout import enforces_access
from dunning.reads.verdicts import CycleReview, Notice, PolicyFacts, SubscriptionReview, Verdict, evaluate
from dunning.states import DELINQUENT_STATES, SETTLED_STATES
from subscriptions.models import Subscription

NOTIFICATION_TOPIC = "notification.requested"


def policy_facts(policy: DunningPolicy) -> PolicyFacts:
    spec = policy_spec(policy)
    return PolicyFacts(
        identity=policy.identity or None, has_grace=spec.has_grace, grace_duration=spec.grace_duration,
        grace_profile=spec.grace_profile, restricted_profile=spec.restricted_profile,
        max_attempts=spec.max_attempts, retry_authority=spec.retry_authority, prices=tuple(spec.prices),
        is_default=spec.is_default,
    )


def subscription_review(subscription: Subscription, *, now: datetime) -> SubscriptionReview:
    """The evaluator's input for one subscription as stored now (five queries: four, and the rollout stage)."""
    sub = Subscription.objects.select_related("policy").get(pk=subscription.pk)
    cycles = list(
        DunningCycle.objects.filter(subscription=sub).select_related("invoice", "policy").order_by("opened_at", "pk")
    )
    receipts = {
        row["cycle_id"]: row
        for row in TransitionReceipt.objects.filter(subscription=sub, accepted=True, cycle__isnull=False)
        .values("cycle_id")
        .annotate(
            latest=Max("id"),
            settled=Max("id", filter=Q(to_state__in=SETTLED_STATES) & ~Q(from_state=F("to_state"))),
        )
        .order_by()
    }
    notices: dict[str, list[Notice]] = {}
    outbox = (
        OutboxMessage.objects.filter(subscription=sub, topic=NOTIFICATION_TOPIC)
        .order_by("id")
        .values_list("payload", "created_at", "receipt_id")
    )
    for payload, created_at, receipt_id in outbox:
        body: dict[str, Any] = payload if isinstance(payload, dict) else {}
        notices.setdefault(str(body.get("cycle", "")), []).append(
            Notice(template=str(body.get("template", "")), requested_at=created_at, receipt_id=receipt_id)
        )

    facts: dict[int, PolicyFacts] = {}

    def facts_for(policy: DunningPolicy) -> PolicyFacts:
        if policy.pk not in facts:
            facts[policy.pk] = policy_facts(policy)
        return facts[policy.pk]

    reviews = []
    for cycle in cycles:
        own = facts_for(cycle.policy)
        audit = receipts.get(cycle.pk, {})
        reviews.append(CycleReview(
            cycle_id=str(cycle.cycle_id), state=cycle.state, policy=own, failure_class=cycle.failure_class,
            customer_action_required=cycle.customer_action_required, next_attempt_at=cycle.next_attempt_at,
            attempts_made=attempts_made(cycle, retry_authority=own.retry_authority),
            grace_started_at=cycle.grace_started_at, grace_expires_at=cycle.grace_expires_at,
            exception_owner=cycle.exception_owner,
            exception_ticket=cycle.exception_ticket, exception_reason=cycle.exception_reason,
            exception_expires_at=cycle.exception_expires_at, exception_profile=cycle.exception_profile,
            suspended_state=cycle.suspended_state, settled_at=cycle.settled_at,
            settled_receipt_id=audit.get("settled"), audit_ref=audit.get("latest"),
            notices=tuple(notices.get(str(cycle.cycle_id), ())), invoice_ref=cycle.invoice.provider_invoice_id,
            invoice_status=cycle.invoice.status, invoice_prices=tuple(cycle.invoice.price_ids or ()),
        ))

    spec = policy_spec(sub.policy)
    decision = with_contract(aggregate_decision(
        [cycle_view(c) for c in cycles if c.state in DELINQUENT_STATES],
        recover_with_remaining_debt=spec.recover_with_remaining_debt,
    ), sub, spec, now)
    return SubscriptionReview(
        subscription_id=str(sub.pk), billing_interval=sub.billing_interval, price_id=sub.price_id,
        entitlement_profile=sub.entitlement_profile, policy=facts_for(sub.policy), now=now,
        cycles=tuple(reviews), expected_profile=decision.profile,
        enforces_access=enforces_access(spec, subscription_key=sub.provider_subscription_id, cohort=sub.cohort,
                                        subscription_pk=sub.pk, now=now),
        provider_status=sub.provider_status, provider_subscription_id=sub.provider_subscription_id,
    )


def subscription_verdict(subscription: Subscription, *, now: datetime | None = None) -> Verdict:
    """RECOVERY_REVIEW_READY or HOLD with blockers, judged at the trusted ``now``."""
    return evaluate(subscription_review(subscription, now=now or trusted_now()))
