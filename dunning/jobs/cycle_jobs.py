"""Jobs that move cycles on the clock (SPEC §10): grace expiry, restriction and cancellation
with a fresh receipt, unknown-payment ownership and resolution, exception expiry, local retries.

Each job finds due rows in due order, claims a row (so concurrent workers skip it), re-reads
it, re-checks that it is still due, and asks the acceptance service. A restriction or
cancellation is asked for only with a receipt fetched moments ago; when the provider cannot be
reached the row is counted as an error and left for the next run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.conf import settings
from django.db.models import Q

from dunning.acceptance.guards import active_incident, attempts_made
from dunning.acceptance.inputs import Cause, Evidence, Expect, StepRequest, TransitionResult
from dunning.acceptance.transitions import cycle_accept_steps
from dunning.actions.alerts import alert_raise
from dunning.actions.local_retry import retry_dispatch, retry_resolve
from dunning.actions.retry_now import customer_payment_resolve
from dunning.actions.unknown_owner import unknown_owner_pick
from dunning.claims import claim
from dunning.clock import trusted_now
from dunning.evidence.fresh_fetch import invoice_fetch_fresh, receipt_evidence
from dunning.evidence.next_edge import invoice_facts, plan_next_step, reconcile_and_read
from dunning.jobs.framework import JobReport, ahead_of_the_clock, due_in_order, scheduled_job
from dunning.jobs.row_pool import claimed_in_threads, provider_io_threads
from dunning.models import DunningCycle, DunningPolicy, IncidentSwitch, ProviderReceipt
from dunning.policy.cache import policy_spec
from dunning.reads.cycles import cycle_read, cycle_read_with_incident
from dunning.states import GRACE_DEADLINE_STATES, NO_RETRY_CLASSES, AttemptState, CycleState
from subscriptions.providers.base import ProviderError, ProviderInvoice

S = CycleState
CLAIM = "cycle"  # one namespace: two jobs never work on the same cycle at once
Row = TypeVar("Row")  # what a job's `read` gives its `work` for each claimed row
Fresh = tuple[ProviderInvoice, ProviderReceipt, datetime]  # a fresh fetch: invoice, receipt, the time to act at


def _ask(run: JobReport, cycle: DunningCycle, edge: str, evidence: Evidence | None = None, *,
         now: datetime | None = None, **params: object) -> TransitionResult:
    return _ask_steps(run, cycle, [StepRequest(edge=edge, evidence=evidence, params=params)], now=now)[0]


def _ask_steps(run: JobReport, cycle: DunningCycle, steps: list[StepRequest], *,
               now: datetime | None = None) -> list[TransitionResult]:
    """The steps in one acceptance (each counted as its own call would be); they stop at a refusal."""
    results = cycle_accept_steps(cycle_pk=cycle.pk, steps=steps, expect=Expect.from_cycle(cycle),
                                 cause=Cause.job(run.job), now=now or run.now)
    for result in results:
        if result.accepted:
            run.changed += 1
        else:
            run.refused += 1
            run.note(f"cycle {cycle.cycle_id}: {result.edge} refused: {result.reason} {result.detail}")
    return results


def _each_claimed(run: JobReport, queryset, due_field: str,  # noqa: ANN001, ANN202
                  read: Callable[[int], Any] = cycle_read):
    for pk in due_in_order(queryset, due_field):
        run.examined += 1
        run.tick()
        with claim(CLAIM, pk) as got:
            if got:
                yield read(pk)


def _work_each_claimed(run: JobReport, queryset, due_field: str,  # noqa: ANN001
                       work: Callable[[JobReport, Row], None], read: Callable[[int], Row] = cycle_read) -> None:
    """`work` on each due row as `read` reads it (the cycle, by default), claimed in due order as
    `_each_claimed` does; for the jobs whose rows wait on a provider fetch, several rows at once
    on DUNNING_PROVIDER_IO_THREADS threads."""
    threads = provider_io_threads()
    if threads <= 1:
        for row in _each_claimed(run, queryset, due_field, read):
            work(run, row)
        return
    claimed_in_threads(run, due_in_order(queryset, due_field), CLAIM,
                       lambda part, pk: work(part, read(pk)), threads=threads)


# --- grace expiry and restriction -------------------------------------------------------------

@scheduled_job("grace_expiry", "grace past its deadline (in grace or waiting on a scheduled retry; an attempt in "
                               "flight holds it) → GRACE_EXPIRED, then restriction only on a fresh unpaid receipt")
def grace_expiry(run: JobReport) -> None:
    # An attempt in flight (a customer's own payment, a prepared retry) holds the deadline until the
    # unknown_payments job or its answer resolves it; asking would only write a refusal every run.
    due = (DunningCycle.objects.filter(state__in=GRACE_DEADLINE_STATES, grace_expires_at__lte=run.now)
           .exclude(pending_attempt__state__in=(AttemptState.DISPATCHING, AttemptState.UNKNOWN)))
    _work_each_claimed(run, due, "grace_expires_at", _expire_then_restrict, read=cycle_read_with_incident)
    _check_overdue_provider_retries(run)


def _expire_then_restrict(run: JobReport, claimed: tuple[DunningCycle, IncidentSwitch | None]) -> None:
    """Grace ends, and restriction follows at once on a fresh unpaid receipt: the invoice is fetched
    first, and when the receipt leaves the cycle where expiry puts it, the three edges are taken
    in one acceptance (one transaction instead of three). A receipt that moves the cycle (paid,
    void, a mirror to correct) is applied after expiry, as a step of its own, before restriction.
    `claimed`: the cycle and the incident pausing restrictions, read in one statement once claimed."""
    cycle, incident = claimed
    if cycle.state not in GRACE_DEADLINE_STATES or cycle.grace_expires_at > run.now:
        return  # another worker or an event got there first
    fresh = None if incident is not None else _fetch_fresh(run, cycle)
    if fresh is None:  # restriction paused, or the provider did not answer: grace still ends
        if _ask(run, cycle, "expire_grace") and incident is not None:
            _note_paused(run, cycle, RESTRICT, incident.ticket)
        return
    inv, receipt, at = fresh
    cycle = cycle_read(cycle.pk)  # not the row read before the fetch: a webhook may have moved it meanwhile
    if cycle.state not in GRACE_DEADLINE_STATES or cycle.grace_expires_at > run.now:
        _escalate_on(run, cycle, RESTRICT, fresh, just_read=True)  # the receipt is applied all the same
        return
    facts = invoice_facts(inv, decline_code="", now=at)
    if plan_next_step(cycle, inv, decline_code="", facts=facts, state=S.GRACE_EXPIRED) is not None:
        expired = _ask(run, cycle, "expire_grace")
        if expired:
            _escalate_on(run, expired.cycle, RESTRICT, fresh, just_read=True)
        return
    begin, complete = _escalation_steps(RESTRICT, inv, receipt)
    _ask_steps(run, cycle, [StepRequest(edge="expire_grace"), begin, complete], now=at)


@scheduled_job("restriction", "GRACE_EXPIRED / RESTRICTING cycles: fetch the invoice; restrict only if it is "
                              "still unpaid; a payment found recovers instead")
def restriction(run: JobReport) -> None:
    due = DunningCycle.objects.filter(state__in=(S.GRACE_EXPIRED, S.RESTRICTING))
    _work_each_claimed(run, due, "grace_expires_at",
                       lambda part, cycle: _escalate_with_fresh_receipt(part, cycle.pk, RESTRICT, cycle))


def _fetch_fresh(run: JobReport, cycle: DunningCycle) -> Fresh | None:
    """Fetch the invoice: (invoice, receipt, the time to act at), or None when the fetch failed
    (counted as an error; nothing changes and the next run tries again).

    A long sweep's `now` falls behind the clock that stamps receipts; acting at the later of the
    two keeps a receipt fetched a moment ago fresh. It never acts earlier than the run's `now`, so
    a run told a future `now` still refuses a receipt that is not fresh for it."""
    try:
        inv, receipt = invoice_fetch_fresh(cycle)
    except ProviderError as exc:
        run.errors += 1
        run.note(f"cycle {cycle.cycle_id}: fetch failed, nothing changed, retried next run: {exc}")
        return None
    return inv, receipt, max(run.now, trusted_now())


def _reconcile(run: JobReport, cycle: DunningCycle, fresh: Fresh, *, just_read: bool = False) -> DunningCycle:
    """Let the evidence move the cycle first (paid → RECOVERED, void → CLOSED_VOID); returns the
    cycle as it stands after the evidence was applied. `just_read`: `cycle` was read (or left by
    an acceptance) after the fetch, so the walk plans on it instead of reading it again."""
    inv, receipt, at = fresh
    results, current = reconcile_and_read(cycle_pk=cycle.pk, inv=inv, receipt=receipt, decline_code="",
                                          cause=Cause.job(run.job), now=at, cycle=cycle if just_read else None)
    run.changed += sum(1 for r in results if r.accepted and r.edge != "record_evidence")
    # Not the row read before the fetch: a webhook may have moved the cycle meanwhile.
    return current or cycle_read(cycle.pk)


@dataclass(frozen=True)
class Escalation:
    """Two edges that reduce access, each taken only from its state; the one marked `cites`
    carries the fresh receipt that justifies it."""

    what: str
    first: tuple[str, str, bool]  # (from state, edge, cites the receipt)
    second: tuple[str, str, bool]


RESTRICT = Escalation("restriction", (S.GRACE_EXPIRED, "begin_restriction", True),
                      (S.RESTRICTING, "complete_restriction", False))
CANCEL = Escalation("cancellation", (S.RESTRICTED, "request_cancellation", False),
                    (S.CANCEL_PENDING, "cancel", True))


def _escalate_with_fresh_receipt(run: JobReport, pk: int, step: Escalation, cycle: DunningCycle | None = None
                                 ) -> None:
    """`cycle`, when given, is the row as an acceptance just left it (saves reading it again)."""
    cycle = cycle or cycle_read(pk)
    if cycle.state not in (step.first[0], step.second[0]):
        return
    incident = active_incident(cycle.subscription.cohort)
    if incident is not None and cycle.state == step.first[0]:
        _note_paused(run, cycle, step, incident.ticket)
        return
    fresh = _fetch_fresh(run, cycle)
    if fresh is not None:
        _escalate_on(run, cycle, step, fresh)


def _escalate_on(run: JobReport, cycle: DunningCycle, step: Escalation, fresh: Fresh, *,
                 just_read: bool = False) -> None:
    """Apply the receipt, then take the escalation's edges from where the cycle stands, in one
    acceptance; the second is decided on the row the first one left."""
    cycle = _reconcile(run, cycle, fresh, just_read=just_read)
    first, second = _escalation_steps(step, fresh[0], fresh[1])
    if cycle.state == step.first[0]:
        _ask_steps(run, cycle, [first, second], now=fresh[2])
    elif cycle.state == step.second[0]:
        _ask_steps(run, cycle, [second], now=fresh[2])


def _escalation_steps(step: Escalation, inv: ProviderInvoice, receipt: ProviderReceipt) -> list[StepRequest]:
    return [StepRequest(edge=edge, evidence=receipt_evidence(inv, receipt) if cites else None)
            for _, edge, cites in (step.first, step.second)]


def _note_paused(run: JobReport, cycle: DunningCycle, step: Escalation, ticket: str) -> None:
    run.refused += 1
    run.note(f"cycle {cycle.cycle_id}: {step.what} paused by incident {ticket}")


def _check_overdue_provider_retries(run: JobReport) -> None:
    """A provider retry whose time passed long ago without news: ask the provider rather than
    wait for a webhook that may never come (a stalled retry must not keep grace open)."""
    overdue = timedelta(seconds=getattr(settings, "DUNNING_PROVIDER_RETRY_OVERDUE_SECONDS", 3600))
    due = DunningCycle.objects.filter(state=S.RETRY_SCHEDULED, policy__retry_authority="PAYMENT_PROVIDER",
                                      next_attempt_at__lte=run.now - overdue)
    _work_each_claimed(run, due, "next_attempt_at", _settle_overdue_retry)


def _settle_overdue_retry(run: JobReport, cycle: DunningCycle) -> None:
    if cycle.state == S.RETRY_SCHEDULED and (fresh := _fetch_fresh(run, cycle)) is not None:
        _reconcile(run, cycle, fresh)


# --- cancellation -------------------------------------------------------------------------------

def _shortest_cancel_delay() -> timedelta | None:
    delays = [d for d in (policy_spec(p).cancel_after_restricted for p in DunningPolicy.objects.all()) if d]
    return min(delays) if delays else None


@scheduled_job("cancellation", "RESTRICTED past the policy's restricted period (or CANCEL_PENDING): cancel only "
                               "on a fresh unpaid receipt; never from PAYMENT_UNKNOWN")
def cancellation(run: JobReport) -> None:
    shortest = _shortest_cancel_delay()
    if shortest is not None:
        due = DunningCycle.objects.filter(state=S.RESTRICTED, restricted_at__lte=run.now - shortest)
        _work_each_claimed(run, due, "restricted_at", _cancel_if_restricted_long_enough)
    pending = DunningCycle.objects.filter(state=S.CANCEL_PENDING)
    _work_each_claimed(run, pending, "cancel_requested_at",
                       lambda part, cycle: _escalate_with_fresh_receipt(part, cycle.pk, CANCEL, cycle))


def _cancel_if_restricted_long_enough(run: JobReport, cycle: DunningCycle) -> None:
    spec = policy_spec(cycle.policy)
    after = spec.cancel_after_restricted
    if (cycle.state != S.RESTRICTED or spec.cancel_after != "MANUAL_OR_POLICY_TERMINAL" or after is None
            or cycle.restricted_at + after > run.now):
        return
    _escalate_with_fresh_receipt(run, cycle.pk, CANCEL, cycle)


# --- unknown payments -----------------------------------------------------------------------------

@scheduled_job("unknown_payments", "PAYMENT_UNKNOWN: assign an owner within the hour, ask the provider, resolve "
                                   "onto the same attempt; dispatches left by a crash are resolved the same way")
def unknown_payments(run: JobReport) -> None:
    unknown = DunningCycle.objects.filter(state=S.PAYMENT_UNKNOWN)
    for cycle in _each_claimed(run, unknown, "unknown_since"):
        if cycle.state != S.PAYMENT_UNKNOWN:
            continue
        if cycle.unknown_owner_id is None:
            _assign_owner(run, cycle)
        _resolve(run, cycle.pk)
    stale = timedelta(seconds=getattr(settings, "DUNNING_DISPATCH_STALE_SECONDS", 120))
    stuck = DunningCycle.objects.filter(state=S.RETRY_DISPATCHING, pending_attempt__dispatched_at__lte=run.now - stale)
    for cycle in _each_claimed(run, stuck, "next_attempt_at"):
        if cycle.state == S.RETRY_DISPATCHING:
            _resolve(run, cycle.pk)
    # A customer's own "Pay now" left without an answer (the cycle's state never moved for it):
    # the provider is asked under the same key, as for a retry.
    unanswered = (DunningCycle.objects.exclude(state__in=(S.RETRY_DISPATCHING, S.PAYMENT_UNKNOWN))
                  .filter(Q(pending_attempt__state=AttemptState.UNKNOWN)
                          | Q(pending_attempt__state=AttemptState.DISPATCHING,
                              pending_attempt__dispatched_at__lte=run.now - stale)))
    for cycle in _each_claimed(run, unanswered, "opened_at"):
        outcome = customer_payment_resolve(cycle_pk=cycle.pk, cause=Cause.job(run.job), now=run.now)
        if outcome.status in ("PAID", "DECLINED"):
            run.changed += 1
        run.note(f"cycle {cycle.cycle_id}: customer payment asked: {outcome.status} {outcome.detail}".strip())


def _assign_owner(run: JobReport, cycle: DunningCycle) -> None:
    owner = unknown_owner_pick()
    if owner is None:
        run.errors += 1
        run.note(f"cycle {cycle.cycle_id}: no billing staff to own this unknown payment")
        alert_raise(kind="UNKNOWN_UNOWNED", dedupe_key=f"unknown-unowned:{cycle.cycle_id}",
                    detail=f"unknown payment on invoice {cycle.invoice.provider_invoice_id} has no owner: "
                           f"nobody is in the unknown-payment owner groups", figures={},
                    now=run.now, subscription=cycle.subscription, invoice=cycle.invoice)
        return
    _ask(run, cycle, "assign_unknown_owner", owner=owner)


def _resolve(run: JobReport, pk: int) -> None:
    outcome = retry_resolve(cycle_pk=pk, cause=Cause.job(run.job), now=run.now)
    if outcome.status in ("PAID", "DECLINED"):
        run.changed += 1
    run.note(f"cycle {pk}: provider asked: {outcome.status} {outcome.detail}".strip())


# --- exceptions -------------------------------------------------------------------------------------

@scheduled_job("exception_expiry", "EXCEPTION_ACTIVE past expiresAt → back to the state it suspended")
def exception_expiry(run: JobReport) -> None:
    due = DunningCycle.objects.filter(state=S.EXCEPTION_ACTIVE, exception_expires_at__lte=run.now)
    for cycle in _each_claimed(run, due, "exception_expires_at"):
        if cycle.state == S.EXCEPTION_ACTIVE and cycle.exception_expires_at <= run.now:
            _ask(run, cycle, "expire_exception")


# --- local retries ----------------------------------------------------------------------------------

def _attempts_left(cycle: DunningCycle) -> bool:
    spec = policy_spec(cycle.policy)
    return attempts_made(cycle, retry_authority=spec.retry_authority) < spec.max_attempts


@scheduled_job("local_retries", "LOCAL authority: schedule by the policy's intervals within the attempt budget, "
                                "dispatch due retries with their persisted idempotency key")
def local_retries(run: JobReport) -> None:
    if ahead_of_the_clock(run):
        return  # a retry charged before its time is a charge the customer was not told about
    local = DunningCycle.objects.filter(policy__retry_authority="LOCAL")
    to_schedule = local.filter(state=S.GRACE_ACTIVE, grace_expires_at__gt=run.now, customer_action_required=False,
                               pending_attempt__isnull=True).exclude(failure_class__in=NO_RETRY_CLASSES)
    for cycle in _each_claimed(run, to_schedule, "grace_expires_at"):
        if cycle.state == S.GRACE_ACTIVE and _attempts_left(cycle):
            _ask(run, cycle, "schedule_retry")
    due = local.filter(state=S.RETRY_SCHEDULED, next_attempt_at__lte=run.now)
    for cycle in _each_claimed(run, due, "next_attempt_at"):
        if cycle.state != S.RETRY_SCHEDULED or cycle.next_attempt_at > run.now:
            continue
        outcome = retry_dispatch(cycle_pk=cycle.pk, cause=Cause.job(run.job), now=run.now)
        if outcome.status == "REFUSED":
            run.refused += 1
        else:
            run.changed += 1
        if outcome.status == "UNKNOWN":
            run.note(f"cycle {cycle.cycle_id}: outcome unknown, left to the unknown_payments job: {outcome.detail}")
