"""The manual compensation queue (seed 003: "已支付未开通" / "已开通未支付" → 人工补偿队列).

A case is one subscription whose money and access disagree in one direction (CompensationKind),
found by the PAID_NOT_RESTORED alert or a reconciliation finding (`dunning.jobs.duties` opens
them). At most one unresolved case per subscription and kind (a partial unique constraint): a
detector seeing the same mismatch again counts a sighting on that case.

A billing lead takes a case (owns it; taking someone else's takes it over) and resolves it with a
resolution, a reason and a ticket. Every resolution but EXPLAINED goes through an existing
service, which decides; the case is resolved only when that service accepted:

- REFETCH_AND_REAPPLY: fetch the invoice fresh (a receipt) and walk the cycle to what it shows
  (`cycle_reconcile_with_invoice`), then recompute access (`contract_recheck`);
- RECOMPUTE_ACCESS: recompute access from the stored cycles (`contract_recheck`), which restores
  or restricts as they call for, never inventing a payment;
- GRANT_EXCEPTION: restore access until a date through the cycle's `grant_exception` edge
  (paid-but-not-entitled only, bounded by the policy's exception maximum);
- EXPLAINED: nothing to change; the reason says why.

Bad input is refused with CompensationRefused (a code and plain words) before anything changes.
The acceptance services commit in their own durable transactions, so the case is marked resolved
after them, with a compare-and-set on its state: two leads resolving at once both reach the
services, whose own fences (expected generation and root) refuse or no-op the second.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F
from django.db.models.functions import Greatest

from dunning.acceptance.guards import STALE_REFUSALS
from dunning.acceptance.inputs import Cause, TransitionResult
from dunning.acceptance.subscription import subscription_accept_change
from dunning.actions.support import cycle_grant_exception
from dunning.clock import trusted_now
from dunning.evidence.fresh_fetch import invoice_fetch_fresh
from dunning.evidence.next_edge import cycle_reconcile_with_invoice
from dunning.models import Alert, DunningCycle, ReconciliationReport
from dunning.models.duties import (
    CompensationAction,
    CompensationActionKind,
    CompensationCase,
    CompensationKind,
    CompensationResolution,
    CompensationState,
)
from dunning.refusals import CodedRefusal
from entitlements.profiles import FULL
from subscriptions.models import Invoice, Subscription
from subscriptions.providers.base import PaymentProvider, ProviderError

log = logging.getLogger(__name__)
PERMISSION = "dunning.work_compensation"
R = CompensationResolution
NEEDS_A_CYCLE = frozenset({R.REFETCH_AND_REAPPLY, R.GRANT_EXCEPTION})


class CompensationRefused(CodedRefusal):
    """The decision cannot be taken; nothing changed. `detail` says why in plain words."""


@dataclass(frozen=True)
class CompensationDecision:
    case: CompensationCase
    action: CompensationAction | None
    text: str


def compensation_open(*, kind: str, subscription: Subscription, detail: str, now: datetime,
                      invoice: Invoice | None = None, alert: Alert | None = None,
                      report: ReconciliationReport | None = None, finding: dict[str, Any] | None = None,
                      actor: str = "job:compensation_intake") -> tuple[CompensationCase, bool]:
    """Open the case for (subscription, kind), or count one more sighting of the unresolved one.
    Either way one CompensationAction names the source (alert or report) it was read from.
    Returns (case, opened_now)."""
    if kind not in CompensationKind.values:
        raise ValueError(f"unknown compensation kind {kind!r}")
    cycle = DunningCycle.objects.filter(invoice=invoice).first() if invoice is not None else None
    source = {"source_alert": alert, "source_report": report}
    for _ in range(3):
        try:
            with transaction.atomic():
                unresolved = (CompensationCase.objects.select_for_update()
                              .filter(subscription=subscription, kind=kind)
                              .exclude(state=CompensationState.RESOLVED).first())
                if unresolved is not None:
                    CompensationCase.objects.filter(pk=unresolved.pk).update(
                        sightings=F("sightings") + 1, last_seen_at=Greatest(F("last_seen_at"), now))
                    CompensationAction.objects.create(case=unresolved, action=CompensationActionKind.SEEN_AGAIN,
                                                      actor=actor, outcome=detail, at=now, **source)
                    unresolved.refresh_from_db()
                    return unresolved, False
                case = CompensationCase.objects.create(
                    kind=kind, subscription=subscription, invoice=invoice, cycle=cycle, source_alert=alert,
                    source_report=report, source_finding=finding or {}, detail=detail, opened_at=now,
                    last_seen_at=now)
                CompensationAction.objects.create(case=case, action=CompensationActionKind.OPEN, actor=actor,
                                                  outcome=detail, at=now, **source)
        except IntegrityError:
            continue  # another worker opened it first: count the sighting on theirs
        log.warning("compensation case %s opened: %s %s", case.pk, kind, subscription.provider_subscription_id)
        return case, True
    raise RuntimeError(f"could not open or find the {kind} case of subscription {subscription.pk}")


def _require_lead(user: Any) -> None:
    if not getattr(user, "is_authenticated", False) or not user.has_perm(PERMISSION):
        raise CompensationRefused("NOT_A_BILLING_LEAD", "Only a billing lead may own or resolve compensation cases.")


def _locked_open_case(case_pk: int) -> CompensationCase:
    case = CompensationCase.objects.select_for_update().filter(pk=case_pk).first()
    if case is None:
        raise CompensationRefused("NO_SUCH_CASE", f"There is no compensation case {case_pk}.")
    if case.state == CompensationState.RESOLVED:
        raise CompensationRefused("CASE_RESOLVED", f"This case was already resolved ({case.get_resolution_display()}) "
                                                   f"by {case.resolved_by} at {case.resolved_at:%Y-%m-%d %H:%M} UTC.")
    return case


def compensation_take(*, case_pk: int, user: Any, now: datetime | None = None) -> CompensationDecision:
    """`user` (a billing lead) owns the case from now on, taking it over from its owner if another."""
    _require_lead(user)
    now = now or trusted_now()
    with transaction.atomic():
        case = _locked_open_case(case_pk)
        previous = case.owner
        if previous is not None and previous.pk == user.pk:
            return CompensationDecision(case, None, "You already own this case.")
        case.owner, case.owned_at, case.state = user, now, CompensationState.OWNED
        case.save(update_fields=["owner", "owned_at", "state"])
        took = f"taken over from {previous.get_username()}" if previous else "taken"
        action = CompensationAction.objects.create(case=case, action=CompensationActionKind.TAKE,
                                                   actor=user.get_username(), actor_user=user, outcome=took, at=now)
    return CompensationDecision(case, action, f"You own this case now ({took}). Resolve it with a reason and a ticket.")


@dataclass(frozen=True)
class _Applied:
    outcome: str
    receipt_ids: tuple[int, ...]


def _check_input(case: CompensationCase, user: Any, resolution: str, reason: str, ticket: str,
                 exception_expires_at: datetime | None) -> None:
    if resolution not in R.values:
        raise CompensationRefused("UNKNOWN_RESOLUTION", f"Choose one of: {', '.join(R.values)}.")
    if not reason:
        raise CompensationRefused("REASON_REQUIRED", "Say why: resolving a compensation case needs a reason.")
    if not ticket:
        raise CompensationRefused("TICKET_REQUIRED", "Give the ticket reference (e.g. SUP-1234).")
    if case.owner_id != user.pk:
        owner = case.owner.get_username() if case.owner_id else "nobody"
        raise CompensationRefused("NOT_THE_OWNER", f"Take the case first: it is owned by {owner}.")
    if resolution in NEEDS_A_CYCLE and case.cycle_id is None:
        raise CompensationRefused("NO_CYCLE", "This case names no dunning cycle, so there is nothing to re-fetch or "
                                              "except; recompute access or explain it instead.")
    if resolution == R.GRANT_EXCEPTION:
        if case.kind != CompensationKind.PAID_NOT_ENTITLED:
            raise CompensationRefused("WRONG_DIRECTION", "An exception grants access; this customer already has "
                                                         "access they have not paid for.")
        if exception_expires_at is None:
            raise CompensationRefused("EXPIRY_REQUIRED", "An exception needs the date it ends.")


def _refused_by_service(result: TransitionResult) -> CompensationRefused:
    return CompensationRefused(result.reason or "REFUSED",
                               f"The {result.edge} service refused: {result.detail or result.reason}. The case stays "
                               f"open.")


def _recompute(case: CompensationCase, cause: Cause, now: datetime) -> TransitionResult:
    sub = Subscription.objects.get(pk=case.subscription_id)
    return subscription_accept_change(subscription_pk=sub.pk, change="contract_recheck", cause=cause,
                                      expect_root=sub.outstanding_cycle_root, now=now)


def _apply(case: CompensationCase, resolution: str, cause: Cause, now: datetime,
           exception_expires_at: datetime | None, provider: PaymentProvider | None) -> _Applied:
    if resolution == R.EXPLAINED:
        return _Applied("No change: explained.", ())
    if resolution == R.GRANT_EXCEPTION:
        result = cycle_grant_exception(cycle_pk=case.cycle_id, user=cause.user, expires_at=exception_expires_at,
                                       reason=cause.reason, ticket=cause.ticket, profile=FULL, now=now)
        if not result.accepted:
            raise _refused_by_service(result)
        return _Applied(f"Exception granted until {exception_expires_at:%Y-%m-%d %H:%M} UTC; access "
                        f"{result.profile} (generation {result.entitlement_generation}).", (result.receipt_id,))
    receipts: list[int] = []
    walked = ""
    if resolution == R.REFETCH_AND_REAPPLY:
        cycle = DunningCycle.objects.select_related("invoice").get(pk=case.cycle_id)
        try:
            inv, receipt = invoice_fetch_fresh(cycle, provider)
        except ProviderError as exc:
            raise CompensationRefused("PROVIDER_UNAVAILABLE", f"The provider did not answer the fresh fetch: {exc}. "
                                                              "The case stays open.") from exc
        results = cycle_reconcile_with_invoice(cycle_pk=cycle.pk, inv=inv, receipt=receipt, decline_code="",
                                               cause=cause, now=now)
        refused = [r for r in results if not r.accepted and r.reason not in STALE_REFUSALS]
        if refused:
            raise _refused_by_service(refused[0])
        receipts += [r.receipt_id for r in results if r.receipt_id]
        steps = ", ".join(r.edge for r in results if r.accepted) or "nothing to move"
        walked = f"Fresh fetch: invoice {inv.status} (receipt {receipt.pk}); cycle walk: {steps}. "
    result = _recompute(case, cause, now)
    if not result.accepted:
        raise _refused_by_service(result)
    receipts.append(result.receipt_id)
    return _Applied(f"{walked}Access recomputed: {result.profile} (generation {result.entitlement_generation}).",
                    tuple(r for r in receipts if r))


def compensation_resolve(*, case_pk: int, user: Any, resolution: str, reason: str, ticket: str,
                         now: datetime | None = None, exception_expires_at: datetime | None = None,
                         provider: PaymentProvider | None = None) -> CompensationDecision:
    """Resolve the case through the service `resolution` names. Refuses (CompensationRefused,
    nothing changed) bad input, a case not owned by `user`, or a service that refused."""
    _require_lead(user)
    reason, ticket = (reason or "").strip(), (ticket or "").strip()
    now = now or trusted_now()
    with transaction.atomic():
        case = _locked_open_case(case_pk)
        _check_input(case, user, resolution, reason, ticket, exception_expires_at)
    applied = _apply(case, resolution, Cause.staff(user, reason=reason, ticket=ticket), now, exception_expires_at,
                     provider)
    with transaction.atomic():
        case = _locked_open_case(case_pk)
        case.state, case.resolution, case.reason, case.ticket = CompensationState.RESOLVED, resolution, reason, ticket
        case.resolved_by, case.resolved_at = user, now
        case.save(update_fields=["state", "resolution", "reason", "ticket", "resolved_by", "resolved_at"])
        action = CompensationAction.objects.create(
            case=case, action=CompensationActionKind.RESOLVE, actor=user.get_username(), actor_user=user,
            resolution=resolution, reason=reason, ticket=ticket, outcome=applied.outcome,
            receipt_ids=list(applied.receipt_ids), at=now)
    log.info("compensation case %s resolved by %s: %s", case.pk, user.get_username(), resolution)
    return CompensationDecision(case, action, f"Resolved ({R(resolution).label}). {applied.outcome}")
