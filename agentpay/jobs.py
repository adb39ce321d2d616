"""AgentPay's scheduled jobs (Celery beat; each also `manage.py agentpay_jobs --job NAME`).

Each takes `now` (a catch-up may pass a past one) and returns what it did. The acceptance
service re-checks every guard under its locks (deadlines, the trusted clock), so two workers
running the same job at once produce refusals, never double effects.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q

from agentpay.bridge import now_is_not_ahead, trusted_now
from agentpay.chain.audit import confirmed_audit
from agentpay.chain.reconcile import onchain_reconcile
from agentpay.models import PaymentIntent
from agentpay.services.acceptance import intent_accept
from agentpay.services.effects import CRASH_RECOVERY_MARGIN_SECONDS
from agentpay.services.outbox import outbox_relay as agentpay_outbox_relay
from agentpay.services.recovery import (
    fulfillment_resolve_by_query,
    intent_assign_review_owner,
    intent_pass_recovery_deadline,
    review_owner_pick,
)
from agentpay.services.results import Cause, Outcome, Step

BATCH = 500


@dataclass
class JobSummary:
    job: str
    now: datetime
    examined: int = 0
    changed: int = 0
    refused: int = 0
    errors: int = 0
    notes: list[str] = field(default_factory=list)

    def count(self, outcome: Outcome | None, what: str) -> None:
        if outcome is None:
            return
        if outcome.accepted:
            self.changed += 1
        else:
            self.refused += 1
            self.notes.append(f"{outcome.intent_id}: {what} refused {outcome.refusal_code}")


def challenge_expiry(run: JobSummary) -> None:
    """seed §4.1: a challenge unanswered for the TTL (300 s) → expired."""
    cutoff = run.now - timedelta(seconds=settings.AGENTPAY_CHALLENGE_TTL_SECONDS)
    for intent_id in (PaymentIntent.objects.filter(state="challenged", challenged_at__lte=cutoff)
                      .order_by("challenged_at").values_list("intent_id", flat=True)[:BATCH]):
        run.examined += 1
        run.count(intent_accept(intent_id=intent_id, steps=[Step("intent", "timeout")], cause=Cause.job(run.job),
                                now=run.now), "timeout")


def hold_expiry(run: JobSummary) -> None:
    """A hold whose call was never dispatched (the agent's request died after the hold and the
    agent never retried) is released after the TTL, and the intent expires (wallet-ledger-spec
    §5.5); an authorization whose hold was never taken expires after the same TTL. A dispatched
    call is never released here: its unknown outcome stays held."""
    cutoff = run.now - timedelta(seconds=settings.AGENTPAY_UNDISPATCHED_HOLD_TTL_SECONDS)
    due = (PaymentIntent.objects.filter(state="authorized", rail="wallet", fulfillment__state="not_started",
                                        fulfillment__dispatched_at__isnull=True, settlements__state="held",
                                        settlements__hold__created_at__lte=cutoff)
           .filter(Q(processing_until__isnull=True) | Q(processing_until__lte=run.now))
           .order_by("settlements__hold__created_at").values_list("intent_id", flat=True)[:BATCH])
    for intent_id in due:
        run.examined += 1
        run.count(intent_accept(intent_id=intent_id, cause=Cause.job(run.job), now=run.now,
                                steps=[Step("settlement", "hold_expired"), Step("intent", "hold_expired")]),
                  "hold expiry")
    # Authorized but never held (the request died between its two acceptances; C14): the intent
    # alone expires, nothing to release.
    never_held = (PaymentIntent.objects.filter(state="authorized", rail="wallet", state_changed_at__lte=cutoff,
                                               fulfillment__state="not_started", settlements__state="not_started")
                  .filter(Q(processing_until__isnull=True) | Q(processing_until__lte=run.now))
                  .order_by("state_changed_at").values_list("intent_id", flat=True)[:BATCH])
    for intent_id in never_held:
        run.examined += 1
        run.count(intent_accept(intent_id=intent_id, cause=Cause.job(run.job), now=run.now,
                                steps=[Step("intent", "hold_expired", {"never_held": True})]), "authorization expiry")


def fulfillment_status_query(run: JobSummary) -> None:
    """Ask the upstream about every unknown fulfillment of an authorized intent; and a call
    whose dispatcher vanished (in progress past its timeouts) is unknown, not in progress."""
    cause = Cause.job(run.job)
    margin = timedelta(seconds=CRASH_RECOVERY_MARGIN_SECONDS)
    lost = (PaymentIntent.objects.filter(state="authorized", fulfillment__state="in_progress")
            .select_related("route", "fulfillment").order_by("fulfillment__dispatched_at")[:BATCH])
    for intent in lost:
        route = intent.route
        if intent.fulfillment.dispatched_at + timedelta(seconds=route.connect_timeout_seconds
                                                        + route.read_timeout_seconds) + margin > run.now:
            continue
        run.examined += 1
        run.count(intent_accept(intent_id=intent.intent_id, cause=cause, now=run.now, steps=[
            Step("fulfillment", "upstream_timeout", {"cause": "crash_recovery",
                                                     "error": "no answer recorded: the dispatcher was lost"})]),
            "upstream_timeout")
    # Evidence keeps applying after the recovery deadline (the spec's C04): needs_review too.
    unknown = (PaymentIntent.objects.filter(state__in=["authorized", "needs_review"], fulfillment__state="unknown")
               .select_related("route", "fulfillment").order_by("fulfillment__unknown_since")[:BATCH])
    for intent in unknown:
        run.examined += 1
        answer, outcome = fulfillment_resolve_by_query(intent=intent, cause=cause, now=run.now)
        run.notes.append(f"{intent.intent_id}: upstream says {answer}")
        run.count(outcome, "status query")


def recovery_deadline(run: JobSummary) -> None:
    """Unknown past the recovery deadline → needs_review; every needs-review intent gets an owner
    (SPEC §16: within one hour; this job runs every minute)."""
    cause = Cause.job(run.job)
    due = (PaymentIntent.objects.filter(state="authorized")
           .filter(Q(fulfillment__state="unknown") & Q(fulfillment__recovery_deadline__lte=run.now))
           .values_list("intent_id", flat=True)[:BATCH])
    for intent_id in due:
        run.examined += 1
        intent = PaymentIntent.objects.get(intent_id=intent_id)
        run.count(intent_pass_recovery_deadline(intent=intent, cause=cause, now=run.now), "recovery deadline")
    for intent_id in (PaymentIntent.objects.filter(state="needs_review", review_owner__isnull=True)
                      .values_list("intent_id", flat=True)[:BATCH]):
        owner = review_owner_pick()
        if owner is None:
            run.errors += 1
            run.notes.append(f"{intent_id}: nobody in {settings.AGENTPAY_REVIEW_OWNER_GROUPS} to own the review")
            continue
        intent_assign_review_owner(intent_id=intent_id, owner=owner, cause=cause, now=run.now)
        run.changed += 1


def outbox_relay(run: JobSummary) -> None:
    """Publish committed outbox rows to their consumers (agentpay.services.outbox)."""
    relayed = agentpay_outbox_relay(now=run.now)
    run.examined += relayed.published + relayed.failed + relayed.skipped
    run.changed += relayed.published
    run.errors += relayed.failed


JOBS: dict[str, Callable[[JobSummary], None]] = {
    "agentpay_challenge_expiry": challenge_expiry,
    "agentpay_hold_expiry": hold_expiry,
    "agentpay_fulfillment_status_query": fulfillment_status_query,
    "agentpay_recovery_deadline": recovery_deadline,
    "agentpay_outbox_relay": outbox_relay,
    # settle (issue 18): undecided settlement and refund transactions, on-chain deadlines.
    "agentpay_onchain_reconcile": onchain_reconcile,
    # a reorg deeper than the depth after confirmed (agentpay.chain.audit): evidence, never a state change.
    "agentpay_confirmed_audit": confirmed_audit,
}


def agentpay_job_run(name: str, *, now: datetime | None = None) -> JobSummary:
    if name not in JOBS:
        raise KeyError(f"unknown job {name!r}; known: {', '.join(JOBS)}")
    run = JobSummary(job=name, now=now or trusted_now())
    ok, clock = now_is_not_ahead(run.now)
    if not ok:  # a catch-up may act in the past, never ahead of the trusted clock
        run.refused += 1
        run.notes.append(f"refused: asked at {run.now.isoformat()}, the trusted clock reads {clock.isoformat()}")
        return run
    JOBS[name](run)
    return run
