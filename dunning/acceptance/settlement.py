"""Step 3–5 of acceptance (SPEC §6): recompute the subscription aggregate, issue a snapshot when
the decision changes, and write the transition receipt and outbox rows.

Called only from inside the acceptance entry points, with the subscription row locked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from dunning.acceptance.aggregate import CycleView, Decision, aggregate_decision, outstanding_root
from dunning.acceptance.contract import ContractView, contract_phase, contract_says
from dunning.acceptance.inputs import Cause, Evidence, Expect
from dunning.acceptance.settlement_writes import SettlementWrites, settlement_write
from dunning.clock import trusted_now
from dunning.models import ENTITLEMENT_CHANGED_TOPIC, DunningCycle, OutboxMessage, TransitionReceipt
from dunning.policy.cache import policy_spec
from dunning.policy.document import PolicyDocument
from dunning.policy.rollout import SHADOW_DECISION, Stage, effective_stage, enforces_access, sends_notifications
from dunning.states import DELINQUENT_STATES
from entitlements.models import EntitlementSnapshot
from entitlements.profiles import get_profile, most_restrictive
from subscriptions.models import Subscription


def cycle_view(cycle: DunningCycle) -> CycleView:
    return CycleView(
        cycle_id=str(cycle.cycle_id), generation=cycle.generation, state=cycle.state,
        invoice_status=cycle.invoice.status, dispute_reopened=cycle.dispute_reopened,
        exception_profile=cycle.exception_profile, conflict_held_profile=cycle.conflict_held_profile,
        spec=policy_spec(cycle.policy),
    )


# What `cycle_view` reads, and no more: this query runs in every acceptance, and Django's cost
# to compile and load it grows with the columns (about 80 with whole rows).
VIEW_COLUMNS = ("cycle_id", "generation", "state", "dispute_reopened", "exception_profile",
                "conflict_held_profile", "invoice__status", "policy__digest")


def subscription_views(subscription: Subscription, changed_cycle: DunningCycle | None) -> list[CycleView]:
    """Views of every cycle that could block: the one just changed as held in memory, the rest
    as stored. Settled cycles never block, so they are not loaded."""
    others = (
        DunningCycle.objects.filter(subscription=subscription, state__in=DELINQUENT_STATES)
        .select_related("invoice", "policy").only(*VIEW_COLUMNS)
    )
    if changed_cycle is not None:
        others = others.exclude(pk=changed_cycle.pk)
    views = [cycle_view(c) for c in others]
    if changed_cycle is not None:
        views.append(cycle_view(changed_cycle))
    return views


def compute_aggregate(subscription: Subscription, changed_cycle: DunningCycle | None,
                      now: datetime | None = None, others: Sequence[CycleView] | None = None) -> tuple[str, Decision]:
    """The root over blocking cycles, and the decision: the debt line's profile, never looser
    than what the contract line allows at `now` (SPEC §7). `others`: the views of the other
    delinquent cycles when the caller read them already (the acceptance transaction does)."""
    if others is None or changed_cycle is None:
        views = subscription_views(subscription, changed_cycle)
    else:
        views = [*others, cycle_view(changed_cycle)]
    spec = policy_spec(subscription.policy)
    debt = aggregate_decision(views, recover_with_remaining_debt=spec.recover_with_remaining_debt)
    return outstanding_root(views), with_contract(debt, subscription, spec, now or trusted_now())


def with_contract(debt: Decision, subscription: Subscription, spec: PolicyDocument, now: datetime) -> Decision:
    _, ceiling, why = contract_says(ContractView.of(subscription), spec, now)
    strictest = most_restrictive((debt.profile, ceiling))
    if strictest == debt.profile:
        reason = debt.reason if ceiling == "FULL" else f"{debt.reason}; {why}"
        return Decision(debt.profile, reason, debt.blocking_count)
    return Decision(strictest, f"{why}; {debt.reason}", debt.blocking_count)


@dataclass(frozen=True)
class Settled:
    receipt: TransitionReceipt
    snapshot_issued: bool


@dataclass(frozen=True)
class Accepted:
    """What an entry point accepted, as its receipt records it, and what it asks for besides."""

    edge: str  # the cycle edge, or the subscription change ("register", "rebind_policy", …)
    cause: Cause
    evidence: Evidence
    from_state: str = ""
    expect: Expect | None = None
    notes: tuple[str, ...] = ()  # appended to the receipt's detail
    notification: str = ""  # a template to request for the changed cycle
    side_effects: tuple[tuple[str, str, dict], ...] = ()  # outbox rows: (topic, dedupe key, payload)


@dataclass(frozen=True)
class _Decided:
    root_before: str
    root: str
    decision: Decision
    issue: bool  # a new entitlement snapshot is issued
    generation: int  # the entitlement generation after this acceptance
    detail: str


def settle_subscription(*, subscription: Subscription, changed_cycle: DunningCycle | None, now: datetime,
                        accepted: Accepted, force_new_generation: bool = False, first_snapshot: bool = False,
                        others: Sequence[CycleView] | None = None, stage: Stage | None = None) -> Settled:
    """Recompute the aggregate, write the receipt, issue a snapshot when the decision changed (or
    `force_new_generation`), save the subscription, and write the outbox rows. `others` and
    `stage`: what the caller read already under the locks (dunning.acceptance.locked_read)."""
    spec = policy_spec(subscription.policy)
    stage = stage or effective_stage(spec, subscription.cohort)  # read once: both access and messages follow it
    decided = _decide(subscription, changed_cycle, now, spec, stage, accepted.notes, others,
                      force_new_generation=force_new_generation, first_snapshot=first_snapshot)
    receipt = _receipt(subscription, changed_cycle, now, accepted, decided)
    outbox: list[OutboxMessage] = []
    snapshot, update_fields = _change_subscription(subscription, receipt, now, decided, outbox)
    _request_outbox(subscription, changed_cycle, now, accepted, spec, stage, receipt, outbox)
    # One statement on PostgreSQL (dunning.acceptance.settlement_writes), in this transaction.
    settlement_write(SettlementWrites(receipt=receipt, snapshot=snapshot, subscription=subscription,
                                      update_fields=update_fields, outbox=outbox))
    return Settled(receipt=receipt, snapshot_issued=decided.issue)


def _decide(subscription: Subscription, changed_cycle: DunningCycle | None, now: datetime, spec: PolicyDocument,
            stage: Stage, notes: tuple[str, ...], others: Sequence[CycleView] | None, *, force_new_generation: bool,
            first_snapshot: bool) -> _Decided:
    root_before = subscription.outstanding_cycle_root
    root, decision = compute_aggregate(subscription, changed_cycle, now, others=others)
    # A subscription's first snapshot is issued whatever the mode: runtime services must be able
    # to read an entitlement for every subscription at once (SPEC §8 "Mirrors").
    enforce = first_snapshot or enforces_access(spec, subscription_key=subscription.provider_subscription_id,
                                                cohort=subscription.cohort, subscription_pk=subscription.pk, now=now,
                                                stage=stage)
    issue = enforce and (decision.profile != subscription.entitlement_profile or force_new_generation)
    detail = "; ".join([decision.reason, *notes])
    if not enforce:
        # The shadow report (dunning.rollout.shadow_report) finds these receipts by this phrase.
        outside = " (outside the rollout)" if stage.mode == "ENFORCE" else ""
        detail += f"; mode {stage.mode}{outside}: {SHADOW_DECISION}"
    generation = subscription.entitlement_generation + 1 if issue else subscription.entitlement_generation
    return _Decided(root_before=root_before, root=root, decision=decision, issue=issue, generation=generation,
                    detail=detail)


def _receipt(subscription: Subscription, changed_cycle: DunningCycle | None, now: datetime,
             accepted: Accepted, decided: _Decided) -> TransitionReceipt:
    """The transition receipt, not yet saved."""
    cause, expect = accepted.cause, accepted.expect
    return TransitionReceipt(
        subscription=subscription, cycle=changed_cycle, edge=accepted.edge, accepted=True,
        from_state=accepted.from_state, to_state=changed_cycle.state if changed_cycle else "", detail=decided.detail,
        cause_kind=cause.kind, cause_ref=cause.ref, actor=cause.actor, actor_user=cause.user, reason=cause.reason,
        ticket=cause.ticket, expected=expect.as_json() if expect else {}, observed={},
        cycle_generation=changed_cycle.generation if changed_cycle else None,
        root_before=decided.root_before, root_after=decided.root, decision_profile=decided.decision.profile,
        entitlement_generation=decided.generation, evidence_receipt=accepted.evidence.receipt,
        policy_id=changed_cycle.policy_id if changed_cycle else subscription.policy_id, trusted_time=now,
    )


def _change_subscription(subscription: Subscription, receipt: TransitionReceipt, now: datetime,
                         decided: _Decided, outbox: list[OutboxMessage]
                         ) -> tuple[EntitlementSnapshot | None, tuple[str, ...]]:
    """The new root, the new snapshot (with its outbox row) and the contract phase, in memory;
    returns the snapshot to write and the columns to save (none when nothing changed)."""
    update_fields = ["outstanding_cycle_root", "row_version", "updated_at"]
    subscription.outstanding_cycle_root = decided.root
    snapshot = None
    if decided.issue:
        snapshot = _issue_snapshot(subscription, receipt, now, decided, outbox)
        update_fields += ["entitlement_profile", "entitlement_generation"]
    phase = contract_phase(ContractView.of(subscription), now)
    if phase != subscription.contract_phase:
        subscription.contract_phase = phase
        update_fields.append("contract_phase")
    if decided.issue or decided.root != decided.root_before or "contract_phase" in update_fields:
        # Evidence that moved nothing leaves the row (and its history) alone; the receipt records it.
        subscription.row_version += 1
        return snapshot, tuple(update_fields)
    return snapshot, ()


def _issue_snapshot(subscription: Subscription, receipt: TransitionReceipt, now: datetime, decided: _Decided,
                    outbox: list[OutboxMessage]) -> EntitlementSnapshot:
    profile = get_profile(decided.decision.profile)
    new_generation, reason = decided.generation, decided.decision.reason
    subscription.entitlement_profile = profile.name
    subscription.entitlement_generation = new_generation
    snapshot = EntitlementSnapshot(
        subscription=subscription, generation=new_generation, profile=profile.name,
        capabilities=profile.capabilities(), reason=reason[:255], issued_at=now, cause_receipt=receipt,
    )
    outbox.append(_outbox(receipt, ENTITLEMENT_CHANGED_TOPIC,
                          f"{ENTITLEMENT_CHANGED_TOPIC}:{subscription.pk}:{new_generation}", {
        "subscription": subscription.pk, "provider_subscription_id": subscription.provider_subscription_id,
        "generation": new_generation, "profile": profile.name, "capabilities": profile.capabilities(),
        "reason": reason, "issued_at": now.isoformat(),
    }, now))
    return snapshot


def _request_outbox(subscription: Subscription, changed_cycle: DunningCycle | None, now: datetime,
                    accepted: Accepted, spec: PolicyDocument, stage: Stage, receipt: TransitionReceipt,
                    outbox: list[OutboxMessage]) -> None:
    """The notification the edge asks for (when the policy sends them) and its other side effects."""
    notification = accepted.notification
    if notification and changed_cycle is not None and sends_notifications(
        spec, subscription_key=subscription.provider_subscription_id, cohort=subscription.cohort,
        subscription_pk=subscription.pk, now=now, stage=stage,
    ):
        outbox.append(_outbox(receipt, "notification.requested",
                f"notification:{changed_cycle.cycle_id}:{notification}:{changed_cycle.generation}", {
                    "subscription": subscription.pk, "cycle": str(changed_cycle.cycle_id),
                    "template": notification, "template_generation": spec.template_generation,
                    "state": changed_cycle.state,
                }, now))
    for topic, dedupe_key, payload in accepted.side_effects:  # e.g. a provider call an edge asked for
        outbox.append(_outbox(receipt, topic, dedupe_key, payload, now))


def _outbox(receipt: TransitionReceipt, topic: str, dedupe_key: str, payload: dict, now: datetime) -> OutboxMessage:
    return OutboxMessage(
        topic=topic, dedupe_key=dedupe_key, payload=payload, subscription=receipt.subscription,
        receipt=receipt, created_at=now,
    )
