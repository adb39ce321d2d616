"""The transition-acceptance service (SPEC §6): the only writer of cycle state, the
subscription's outstanding root and its entitlement generation.

Every call is one durable transaction: lock subscription then cycle (always in that order, so
two acceptances cannot deadlock), compare-and-set the caller's expectations, apply evidence
and one FSM edge, recompute the root and the aggregate decision, issue a snapshot when the
decision changed, and write the transition receipt and outbox rows. A refusal rolls all of
that back and is recorded in its own transaction as a rejection receipt. `cycle_accept_steps`
takes several edges of one cycle that way in one transaction (a job's GRACE_ACTIVE →
GRACE_EXPIRED → RESTRICTING → RESTRICTED), each step as its own call would take it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from functools import partial
from typing import Any

from django.db import transaction
from django.db.models import Max
from django.db.models.functions import Coalesce
from django_fsm import ConcurrentTransition, TransitionNotAllowed, can_proceed

from dunning.acceptance.cycle_writes import CycleWrites
from dunning.acceptance.deadlocks import retry_on_deadlock
from dunning.acceptance.edges import EDGES, invoice_digest, local_idempotency_key
from dunning.acceptance.guards import EdgeContext, Refusal
from dunning.acceptance.inputs import Cause, Evidence, Expect, StepRequest, TransitionResult
from dunning.acceptance.locked_read import LockedRead, lock_and_read
from dunning.acceptance.settlement import Accepted, settle_subscription
from dunning.acceptance_scope import acceptance_scope
from dunning.clock import now_is_not_ahead, trusted_now
from dunning.models import AttemptOrigin, DunningCycle, FactKind, MonetaryFact, PaymentAttempt, TransitionReceipt
from dunning.policy.cache import policy_spec
from dunning.state_names import invoice_status_rank
from dunning.states import TERMINAL_STATES, AttemptState
from subscriptions.models import Subscription

log = logging.getLogger(__name__)


def cycle_accept_transition(
    *,
    cycle_pk: int,
    edge: str,
    expect: Expect,
    cause: Cause,
    evidence: Evidence | None = None,
    params: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> TransitionResult:
    """Accept or reject one edge on one cycle. Never raises for an expected refusal."""
    step = StepRequest(edge=edge, evidence=evidence, params=params)
    return cycle_accept_steps(cycle_pk=cycle_pk, steps=(step,), expect=expect, cause=cause, now=now)[0]


class _StepRefused(Exception):
    def __init__(self, index: int, refusal: Refusal) -> None:
        super().__init__(f"step {index}: {refusal}")
        self.index, self.refusal = index, refusal


def cycle_accept_steps(
    *, cycle_pk: int, steps: Sequence[StepRequest], expect: Expect, cause: Cause, now: datetime | None = None,
) -> list[TransitionResult]:
    """Accept several edges on one cycle in ONE durable transaction under one lock and one read,
    each step taken exactly as `cycle_accept_transition` would take it on the row the step before
    left: its own guards, its compare-and-set (`expect` for the first step, the row as the step
    before left it for the others), its generation, its receipt, its snapshot and outbox rows.
    Never raises for an expected refusal.

    It stops at the first refusal: the steps before it stay accepted, the refused step gets its
    rejection receipt in a transaction of its own (as a call of its own would), the later steps
    are not tried. A refusal at step k rolls the transaction back and steps 1..k-1 are taken
    again in a new one: no savepoint per step (two statements each), and no row left in memory
    as a refused step half changed it.

    The cycle row itself is written once, after the last step (dunning.acceptance.cycle_writes:
    one UPDATE with the first step's compare-and-set, one history row per step)."""
    if not steps:
        raise ValueError("no steps to accept")
    for step in steps:
        if step.edge not in EDGES:
            raise ValueError(f"unknown edge {step.edge!r}; known: {', '.join(sorted(EDGES))}")
    now = now or trusted_now()
    todo = [StepRequest(edge=s.edge, evidence=s.evidence or Evidence(), params=dict(s.params or {})) for s in steps]
    what = f"acceptance of {'+'.join(s.edge for s in todo)} on cycle {cycle_pk}"
    results: list[TransitionResult] = []
    refused: tuple[StepRequest, Refusal] | None = None
    while todo:
        try:
            # A deadlock victim rolled back entirely; the decision is taken again on the rows as they are now.
            results = retry_on_deadlock(partial(_accept_all, cycle_pk, tuple(todo), expect, cause, now), what=what)
            break
        except _StepRefused as exc:
            refused, todo = (todo[exc.index], exc.refusal), todo[:exc.index]
    if refused is not None:
        step, refusal = refused
        asked = Expect.from_cycle(results[-1].cycle) if results else expect
        results.append(retry_on_deadlock(
            partial(_record_rejection, cycle_pk, step.edge, asked, cause, step.evidence, now, refusal),
            what=f"rejection of {step.edge} on cycle {cycle_pk}"))
    return results


def _accept_all(cycle_pk: int, steps: Sequence[StepRequest], expect: Expect, cause: Cause,
                now: datetime) -> list[TransitionResult]:
    """Every step or none (`_StepRefused` names the first refused one)."""
    results: list[TransitionResult] = []
    clocks_passed: set[str] = set()
    with transaction.atomic(durable=True), acceptance_scope():
        read = lock_and_read(cycle_pk)
        writes = CycleWrites(read.cycle)
        for index, step in enumerate(steps):
            asked = Expect.from_cycle(read.cycle) if index else expect
            try:
                results.append(_accept_locked(read, step.edge, asked, cause, step.evidence, step.params, now,
                                              clocks_passed, writes))
            except Refusal as refusal:
                raise _StepRefused(index, refusal) from None
        try:
            writes.flush()  # the cycle row as the last step left it, with the first step's compare-and-set
        except ConcurrentTransition:
            raise _StepRefused(0, Refusal("STALE_CYCLE_GENERATION", "the cycle changed while this transition "
                                                                    "was applied")) from None
    return [replace(r, cycle=None) for r in results[:-1]] + results[-1:]


def _accept_locked(
    read: LockedRead, edge: str, expect: Expect, cause: Cause,
    evidence: Evidence, params: dict[str, Any], now: datetime, clocks_passed: set[str], writes: CycleWrites,
) -> TransitionResult:
    """One edge on the rows `read` locked, as the step before (if any) left them in memory.
    `clocks_passed`: the clocks this acceptance already found `now` not ahead of; every step asks
    at the same `now` and a clock only moves forward, so each is read once per acceptance.
    `writes`: where the cycle row is staged, written when the last step is taken."""
    subscription, cycle = read.subscription, read.cycle
    _compare_and_set(expect, cycle, subscription)
    ctx = EdgeContext(
        cycle=cycle, subscription=subscription, invoice=cycle.invoice, spec=policy_spec(cycle.policy),
        now=now, cause=cause, evidence=evidence, params=params, pending_attempt=cycle.pending_attempt,
        invoice_status_before=cycle.invoice.status, incident=read.incident, incident_read=read.incident_read,
    )
    from_state = cycle.state
    rule = EDGES[edge]
    if rule.time_guarded and ctx.spec.clock not in clocks_passed:
        # A catch-up may act at a past `now`, never at one the trusted clock has not reached:
        # `run_jobs --now <days ahead>` must not take a step early that a later run would finish.
        ok, clock = now_is_not_ahead(now, ctx.spec.clock, read.database_clock)
        if not ok:
            raise Refusal("NOW_AFTER_TRUSTED_CLOCK", f"asked at {now.isoformat()}, trusted clock reads "
                                                     f"{clock.isoformat()}")
        clocks_passed.add(ctx.spec.clock)
    if rule.moves_cycle and not can_proceed(getattr(cycle, edge), check_conditions=False):
        raise Refusal("EDGE_NOT_ALLOWED", f"{edge} is not an edge from {from_state}")
    invoice_changed = _apply_invoice_evidence(ctx)
    facts_recorded = _append_facts(ctx)
    try:
        rule.apply(ctx)
    except TransitionNotAllowed:
        raise Refusal("EDGE_NOT_ALLOWED", f"{edge} is not an edge from {from_state}") from None
    if from_state not in TERMINAL_STATES and (rule.moves_cycle or rule.writes_cycle or invoice_changed):
        cycle.generation += 1
        try:
            writes.stage()
        except ConcurrentTransition:
            raise Refusal("STALE_CYCLE_GENERATION", "the cycle changed while this transition was applied") from None
    settled = settle_subscription(subscription=subscription, changed_cycle=cycle, now=now, accepted=Accepted(
        edge=edge, cause=cause, evidence=evidence, from_state=from_state, expect=expect,
        notes=tuple(ctx.notes), notification=rule.notification if rule.moves_cycle else "",
        side_effects=tuple(ctx.side_effects),
    ), others=read.others, stage=read.stage)
    return TransitionResult(
        accepted=True, edge=edge, receipt_id=settled.receipt.pk, from_state=from_state, to_state=cycle.state,
        cycle_generation=cycle.generation, root=subscription.outstanding_cycle_root,
        profile=subscription.entitlement_profile, entitlement_generation=subscription.entitlement_generation,
        snapshot_issued=settled.snapshot_issued, facts_recorded=facts_recorded, cycle=cycle,
    )


def _compare_and_set(expect: Expect, cycle: DunningCycle, subscription: Subscription) -> None:
    pending = cycle.pending_attempt.operation_id if cycle.pending_attempt_id else None
    checks = (
        ("STALE_CYCLE_GENERATION", expect.cycle_generation, cycle.generation),
        ("STALE_INVOICE_REVISION", expect.invoice_revision, cycle.invoice.revision),
        ("STALE_ATTEMPT", expect.attempt_id, pending),
        ("POLICY_MISMATCH", expect.policy_id, cycle.policy_id),
        ("STALE_ROOT", expect.root, subscription.outstanding_cycle_root),
    )
    for code, expected, actual in checks:
        if expected != actual:
            raise Refusal(code, f"expected {expected}, found {actual}")


def _apply_invoice_evidence(ctx: EdgeContext) -> bool:
    """Bring the invoice mirror to what the fresh receipt shows; bump its revision if it moved."""
    update = ctx.evidence.invoice
    if update is None:
        return False
    invoice = ctx.invoice
    if invoice_status_rank(update.status) < invoice_status_rank(invoice.status):
        # Whatever asked (a job, a staff action, an event), a receipt that shows the invoice behind
        # its mirror is an old copy; acting on it moved a paid mirror back to open (seed 1).
        raise Refusal("STALE_INVOICE_READ", f"the receipt shows invoice {invoice.provider_invoice_id} "
                                            f"{update.status}, behind the {invoice.status} on record: an old copy")
    changed = [
        name for name in ("status", "amount_due", "amount_paid", "attempt_count", "next_payment_attempt")
        if getattr(invoice, name) != getattr(update, name)
    ]
    if not changed:
        return False
    for name in changed:
        setattr(invoice, name, getattr(update, name))
    invoice.revision += 1
    invoice.save(update_fields=[*changed, "revision", "updated_at"])
    if ctx.cycle.state not in TERMINAL_STATES:
        ctx.cycle.provider_generation = invoice.revision
    ctx.notes.append(f"invoice {invoice.provider_invoice_id} revision {invoice.revision}: {', '.join(changed)}")
    return True


def _append_facts(ctx: EdgeContext) -> int:
    """Append the evidence's money facts, each once (its dedupe key), so that they add up and
    each names the payment attempt it came from.

    Runs with the subscription, cycle and invoice rows locked, so every fact of this invoice is
    written one acceptance at a time; that is what makes the refund increment safe:

    - REFUNDED: a receipt shows a charge's *cumulative* refunded total (the spec's `amount`; its
      dedupe key names charge and total). The fact records the increment over the refunds on
      record for that charge, with the total as `cumulative_amount`. Two events that read the
      same total share the key (one fact); a receipt older than the refunds on record adds nothing.
    - attempt: a failure one of our attempts was answered with (its idempotency key in the fact's
      key) links to that attempt. A failure the invoice numbers n links, under LOCAL authority, to
      local attempt n (attempt 1 is the renewal charge), under provider authority to our attempt
      in flight, else to the provider attempt the record_failure / retry_failed edges keep for the
      invoice (the same key; recorded here first, as the edge runs after the facts). A payment
      links to the attempt that succeeded with it or the one in flight it settles; a refund or
      dispute to the attempt of the payment it reverses. Void and uncollectible name no attempt,
      nor does a payment the provider took with no attempt of ours (its retry, the hosted page).
    """
    cycle, invoice = ctx.cycle, ctx.invoice
    pending = ctx.pending_attempt
    in_flight = pending if pending is not None and pending.state in (AttemptState.DISPATCHING,
                                                                     AttemptState.UNKNOWN) else None

    def provider_attempt(fact: Any, number: str) -> PaymentAttempt:
        # The row `edges._record_provider_attempt` gets by the same key when its edge runs.
        failure_class = ctx.spec.failure_class_for(fact.decline_code or None)
        attempt, _ = PaymentAttempt.objects.get_or_create(
            idempotency_key=f"provider:{invoice.provider_invoice_id}:{fact.provider_ref or number}",
            defaults={
                "cycle": cycle, "origin": AttemptOrigin.PROVIDER,
                "invoice_digest": invoice_digest(invoice.provider_invoice_id, cycle.amount, cycle.currency),
                "amount": cycle.amount, "currency": cycle.currency, "state": AttemptState.FAILED,
                "provider_payment_ref": fact.provider_ref, "decline_code": fact.decline_code,
                "failure_class": failure_class, "created_at": ctx.now, "resolved_at": ctx.now,
            },
        )
        return attempt

    def attempt_for(fact: Any) -> PaymentAttempt | None:
        attempts = PaymentAttempt.objects.filter(cycle=cycle)
        if fact.kind == FactKind.PAYMENT_FAILED:
            which = fact.dedupe_key.rsplit(":", 1)[-1]  # failed:<invoice>:<attempt number or idempotency key>
            own = attempts.filter(idempotency_key=which).first()
            if own is not None or not which.isdigit():
                return own or in_flight
            if ctx.spec.retry_authority == "LOCAL":
                # Attempt 1 is the renewal charge (the provider's); local attempt n holds slot n.
                slot = attempts.filter(idempotency_key=local_idempotency_key(cycle.cycle_id, int(which))).first()
                return slot or provider_attempt(fact, which)
            return in_flight or provider_attempt(fact, which)
        if fact.kind == FactKind.PAYMENT_SUCCEEDED:
            paid_with = attempts.filter(state=AttemptState.SUCCEEDED, provider_payment_ref=fact.provider_ref)
            return (paid_with.first() if fact.provider_ref else None) or in_flight
        if fact.kind in (FactKind.INVOICE_VOIDED, FactKind.MARKED_UNCOLLECTIBLE):
            return None
        # Refunds and disputes reverse the payment of this invoice: its attempt, if it had one.
        paid = (MonetaryFact.objects.filter(invoice=invoice, kind=FactKind.PAYMENT_SUCCEEDED, attempt__isnull=False)
                .select_related("attempt").first())
        if paid is not None:
            return paid.attempt
        return attempts.filter(state=AttemptState.SUCCEEDED, provider_payment_ref=fact.provider_ref).first() \
            if fact.provider_ref else None

    recorded = 0
    for fact in ctx.evidence.facts:
        if MonetaryFact.objects.filter(dedupe_key=fact.dedupe_key).exists():
            continue
        amount, cumulative = fact.amount, None
        if fact.kind == FactKind.REFUNDED:
            # Facts written before `cumulative_amount` hold the cumulative total as their amount.
            on_record = (MonetaryFact.objects.filter(invoice=invoice, kind=FactKind.REFUNDED,
                                                     provider_ref=fact.provider_ref)
                         .aggregate(total=Max(Coalesce("cumulative_amount", "amount")))["total"] or 0)
            cumulative, amount = fact.amount, fact.amount - on_record
            if amount <= 0:
                ctx.notes.append(f"refund total {cumulative} of {fact.provider_ref} is already on record "
                                 f"({on_record}); nothing new refunded")
                continue
        MonetaryFact.objects.create(
            dedupe_key=fact.dedupe_key, kind=fact.kind, invoice=invoice, cycle=cycle, attempt=attempt_for(fact),
            amount=amount, cumulative_amount=cumulative, currency=fact.currency, provider_ref=fact.provider_ref,
            decline_code=fact.decline_code, receipt=ctx.evidence.receipt, occurred_at=fact.occurred_at,
            recorded_at=ctx.now,
        )
        recorded += 1
    return recorded


def _record_rejection(
    cycle_pk: int, edge: str, expect: Expect, cause: Cause,
    evidence: Evidence, now: datetime, refusal: Refusal,
) -> TransitionResult:
    with transaction.atomic(durable=True):
        cycle = DunningCycle.objects.select_related("invoice", "pending_attempt", "subscription").get(pk=cycle_pk)
        subscription = cycle.subscription
        receipt = TransitionReceipt.objects.create(
            subscription=subscription, cycle=cycle, edge=edge, accepted=False, from_state=cycle.state,
            rejection_reason=refusal.code, detail=refusal.detail, cause_kind=cause.kind, cause_ref=cause.ref,
            actor=cause.actor, actor_user=cause.user, reason=cause.reason, ticket=cause.ticket,
            expected=expect.as_json(), observed=_observed(cycle, subscription), cycle_generation=cycle.generation,
            root_before=subscription.outstanding_cycle_root, root_after=subscription.outstanding_cycle_root,
            decision_profile=subscription.entitlement_profile,
            entitlement_generation=subscription.entitlement_generation,
            evidence_receipt=evidence.receipt, policy_id=cycle.policy_id, trusted_time=now,
        )
    log.info("rejected %s on cycle %s: %s", edge, cycle.cycle_id, refusal)
    return TransitionResult(
        accepted=False, edge=edge, reason=refusal.code, detail=refusal.detail, receipt_id=receipt.pk,
        from_state=cycle.state, to_state=cycle.state, cycle_generation=cycle.generation,
        root=subscription.outstanding_cycle_root, profile=subscription.entitlement_profile,
        entitlement_generation=subscription.entitlement_generation,
    )


def _observed(cycle: DunningCycle, subscription: Subscription) -> dict[str, Any]:
    return {
        "cycle_generation": cycle.generation,
        "invoice_revision": cycle.invoice.revision,
        "attempt_id": str(cycle.pending_attempt.operation_id) if cycle.pending_attempt_id else None,
        "policy_id": cycle.policy_id,
        "root": subscription.outstanding_cycle_root,
        "state": cycle.state,
    }
