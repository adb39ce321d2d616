"""The subscription aggregate's acceptance (SPEC §6, §7): decisions that move no cycle along its
edges but change the subscription itself, each in one durable transaction with the row locked,
a compare-and-set, a recomputed root and decision, and a transition receipt (accepted or
rejected):

- ``contract_update``: mirror the provider subscription from one fresh fetch (the contract
  line). Fenced twice: the caller's expected ``contract_revision``, and the fetch time (a read
  older than the newest applied one is refused, so it never rolls the contract back). A price
  or interval change rebinds the subscription's policy for *new* invoices; open cycles keep the
  policy they were opened under. A canceled status confirms a cancellation we asked for.
- ``contract_recheck``: no new evidence; time passed a contract deadline we already hold (the
  period end of a contract set to cancel then, the end of a pause), so access is recomputed.
- ``reissue_entitlement``: issue generation + 1 whatever the decision, so every consumer
  refreshes (leaving an incident).
- ``rebind_policy``: bind the subscription and its open cycles to another policy (an incident
  rolls a cohort back to the previous version); each open cycle's generation moves, so callers
  holding the old policy expectation are refused.
- ``rebind_policy_forward``: bind the subscription to a newer policy for *new* cycles only (a
  rollout moves a cohort forward); open cycles keep the policy they were opened under. Fenced on
  the root and on the policy the caller saw (``expect_policy_pk``).

None of them touches invoices, attempts or money facts: they never fabricate a payment.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction

from dunning.acceptance.guards import Refusal
from dunning.acceptance.inputs import Cause, ContractUpdate, Evidence, TransitionResult
from dunning.acceptance.settlement import Accepted, settle_subscription
from dunning.acceptance_scope import acceptance_scope
from dunning.clock import now_is_not_ahead, trusted_now
from dunning.models import DunningCycle, DunningPolicy, TransitionReceipt
from dunning.policy.cache import policy_spec
from dunning.policy.publishing import NoPolicyError, policy_for_prices, policy_provider
from dunning.policy.vocabulary import CONTRACT_STATES
from dunning.states import OPEN_STATES
from subscriptions.models import Subscription

log = logging.getLogger(__name__)

SUBSCRIPTION_CHANGES = ("contract_update", "contract_recheck", "reissue_entitlement", "rebind_policy",
                        "rebind_policy_forward")
TIME_GUARDED = frozenset({"contract_recheck", "contract_update"})


@dataclass(frozen=True)
class SubscriptionExpect:
    """What the caller saw: the root (debt line) and/or the contract revision (contract line)."""

    root: str | None = None
    contract_revision: int | None = None
    policy_pk: int | None = None


def subscription_accept_change(
    *,
    subscription_pk: int,
    change: str,
    cause: Cause,
    expect_root: str | None = None,
    expect_contract_revision: int | None = None,
    policy_pk: int | None = None,
    expect_policy_pk: int | None = None,
    contract: ContractUpdate | None = None,
    evidence: Evidence | None = None,
    now: datetime | None = None,
) -> TransitionResult:
    """Accept or reject one subscription-level change. Never raises for an expected refusal."""
    if change not in SUBSCRIPTION_CHANGES:
        raise ValueError(f"unknown subscription change {change!r}; known: {', '.join(SUBSCRIPTION_CHANGES)}")
    now = now or trusted_now()
    evidence = evidence or Evidence()
    expect = SubscriptionExpect(root=expect_root, contract_revision=expect_contract_revision,
                                policy_pk=expect_policy_pk)
    try:
        with transaction.atomic(durable=True), acceptance_scope():
            subscription = Subscription.objects.select_for_update().select_related("policy").get(pk=subscription_pk)
            _compare_and_set(expect, subscription)
            if change in TIME_GUARDED:
                _require_now_not_ahead(subscription, now)
            notes: list[str] = []
            if change == "rebind_policy":
                notes.append(_rebind_with_open_cycles(subscription, policy_pk))
            elif change == "rebind_policy_forward":
                notes.append(_rebind_new_cycles_only(subscription, policy_pk))
            elif change == "contract_update":
                if contract is None:
                    raise ValueError("contract_update needs the contract as fetched")
                notes.extend(_apply_contract(subscription, contract, now))
            settled = settle_subscription(
                subscription=subscription, changed_cycle=None, now=now,
                accepted=Accepted(edge=change, cause=cause, evidence=evidence, notes=tuple(notes)),
                force_new_generation=change == "reissue_entitlement",
            )
    except Refusal as refusal:
        return _record_rejection(subscription_pk, change, expect, cause, evidence, now, refusal)
    return TransitionResult(
        accepted=True, edge=change, receipt_id=settled.receipt.pk, root=subscription.outstanding_cycle_root,
        profile=subscription.entitlement_profile, entitlement_generation=subscription.entitlement_generation,
        snapshot_issued=settled.snapshot_issued, detail=settled.receipt.detail,
        extra={"contract_revision": subscription.contract_revision, "contract_phase": subscription.contract_phase},
    )


def _compare_and_set(expect: SubscriptionExpect, subscription: Subscription) -> None:
    if expect.root is not None and expect.root != subscription.outstanding_cycle_root:
        raise Refusal("STALE_ROOT", f"expected {expect.root}, found {subscription.outstanding_cycle_root}")
    if expect.contract_revision is not None and expect.contract_revision != subscription.contract_revision:
        raise Refusal("STALE_CONTRACT_REVISION",
                      f"expected contract revision {expect.contract_revision}, found {subscription.contract_revision}")
    if expect.policy_pk is not None and expect.policy_pk != subscription.policy_id:
        raise Refusal("POLICY_MOVED", f"expected policy {expect.policy_pk}, the subscription is bound to "
                                      f"{subscription.policy_id}")


def _require_now_not_ahead(subscription: Subscription, now: datetime) -> None:
    ok, clock = now_is_not_ahead(now, policy_spec(subscription.policy).clock)
    if not ok:
        raise Refusal("NOW_AFTER_TRUSTED_CLOCK", f"asked at {now.isoformat()}, trusted clock reads {clock.isoformat()}")


def _apply_contract(subscription: Subscription, update: ContractUpdate, now: datetime) -> list[str]:
    if update.status not in CONTRACT_STATES:
        raise Refusal("UNKNOWN_CONTRACT_STATUS", f"provider status {update.status!r} is not a contract state we know")
    if subscription.contract_fetched_at is not None and update.fetched_at < subscription.contract_fetched_at:
        raise Refusal("STALE_CONTRACT_READ", f"read fetched {update.fetched_at.isoformat()} is older than the one "
                                             f"applied ({subscription.contract_fetched_at.isoformat()})")
    incoming = update.mirror_fields()
    changed = [name for name, value in incoming.items() if getattr(subscription, name) != value]
    for name in changed:
        setattr(subscription, name, incoming[name])
    notes = [f"contract {', '.join(f'{n}={incoming[n]}' for n in changed)}"] if changed else []
    notes.extend(_follow_plan(subscription, update, changed))
    if update.status == "canceled" and subscription.provider_cancel_requested_at and \
            subscription.provider_cancel_confirmed_at is None:
        subscription.provider_cancel_confirmed_at = now
        changed.append("provider_cancel_confirmed_at")
        notes.append("the provider confirmed the cancellation we asked for")
    if changed:
        subscription.contract_revision += 1
        changed.append("contract_revision")
    subscription.contract_fetched_at = update.fetched_at
    subscription.save(update_fields=[*changed, "contract_fetched_at", "updated_at"])
    return notes


def _follow_plan(subscription: Subscription, update: ContractUpdate, changed: list[str]) -> list[str]:
    """A price or interval move rebinds the policy for new invoices only (seed 002 "transfer")."""
    interval = "year" if update.interval == "year" else "month"
    price_id = update.price_ids[0] if update.price_ids else subscription.price_id
    if (price_id, interval) == (subscription.price_id, subscription.billing_interval):
        return []
    try:
        policy = policy_for_prices(update.price_ids or (price_id,), cohort=subscription.cohort,
                                   provider=subscription.provider, account=subscription.provider_account)
    except NoPolicyError as exc:
        raise Refusal("NO_POLICY_FOR_PRICE", str(exc)) from None
    notes = [f"plan moved from {subscription.price_id} ({subscription.billing_interval}) to {price_id} ({interval})"]
    subscription.price_id, subscription.billing_interval = price_id, interval
    changed.extend(["price_id", "billing_interval"])
    if policy.pk != subscription.policy_id:
        notes.append(f"new invoices bind to {policy.identity} (was {subscription.policy.identity}); "
                     "open cycles keep their policy")
        subscription.policy = policy
        changed.append("policy")
    return notes


def _bind(subscription: Subscription, policy_pk: int | None) -> tuple[DunningPolicy, DunningPolicy]:
    """Bind the subscription itself to the policy; (previous, new)."""
    policy = DunningPolicy.objects.filter(pk=policy_pk).first()
    if policy is None:
        raise Refusal("UNKNOWN_POLICY", f"no published policy {policy_pk}")
    policy_provider_name = policy_provider(policy)[0]
    if policy_provider_name != subscription.provider:
        raise Refusal("PROVIDER_MISMATCH", f"{policy.identity} is a {policy_provider_name} policy; this subscription "
                                           f"is collected through {subscription.provider}")
    previous = subscription.policy
    if previous.pk == policy.pk:
        raise Refusal("ALREADY_BOUND", f"subscription is already bound to {policy.identity}")
    subscription.policy = policy
    subscription.save(update_fields=["policy", "updated_at"])
    return previous, policy


def _rebind_with_open_cycles(subscription: Subscription, policy_pk: int | None) -> str:
    previous, policy = _bind(subscription, policy_pk)
    open_cycles = DunningCycle.objects.select_for_update().filter(subscription=subscription, state__in=OPEN_STATES)
    for cycle in open_cycles:
        cycle.policy = policy
        cycle.generation += 1
        cycle.save()
    return f"rebound from {previous.identity} to {policy.identity}"


def _rebind_new_cycles_only(subscription: Subscription, policy_pk: int | None) -> str:
    previous, policy = _bind(subscription, policy_pk)
    open_count = DunningCycle.objects.filter(subscription=subscription, state__in=OPEN_STATES).count()
    return (f"rebound forward from {previous.identity} to {policy.identity} for new cycles; "
            f"{open_count} open cycle(s) keep {previous.identity}")


def _record_rejection(subscription_pk: int, change: str, expect: SubscriptionExpect, cause: Cause,
                      evidence: Evidence, now: datetime, refusal: Refusal) -> TransitionResult:
    with transaction.atomic(durable=True):
        subscription = Subscription.objects.get(pk=subscription_pk)
        receipt = TransitionReceipt.objects.create(
            subscription=subscription, cycle=None, edge=change, accepted=False, from_state="",
            rejection_reason=refusal.code, detail=refusal.detail, cause_kind=cause.kind, cause_ref=cause.ref,
            actor=cause.actor, actor_user=cause.user, reason=cause.reason, ticket=cause.ticket,
            expected={"root": expect.root, "contract_revision": expect.contract_revision,
                      "policy": expect.policy_pk},
            observed={"root": subscription.outstanding_cycle_root, "contract_revision": subscription.contract_revision,
                      "contract_phase": subscription.contract_phase},
            root_before=subscription.outstanding_cycle_root, root_after=subscription.outstanding_cycle_root,
            decision_profile=subscription.entitlement_profile,
            entitlement_generation=subscription.entitlement_generation, evidence_receipt=evidence.receipt,
            policy_id=subscription.policy_id, trusted_time=now,
        )
    log.info("rejected %s on subscription %s: %s", change, subscription.provider_subscription_id, refusal)
    return TransitionResult(accepted=False, edge=change, reason=refusal.code, detail=refusal.detail,
                            receipt_id=receipt.pk, root=subscription.outstanding_cycle_root,
                            profile=subscription.entitlement_profile,
                            entitlement_generation=subscription.entitlement_generation)
