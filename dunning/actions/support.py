"""Staff decisions of the support console (SPEC §11), as typed services.

Each takes the acting staff user with a reason and a ticket reference and goes through the
acceptance service (cycle edges) or the incident switch; none saves a protected model itself.
The admin parses a form, calls one of these, and reports the result in words.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dunning.acceptance.inputs import Cause, Evidence, Expect, TransitionResult
from dunning.acceptance.subscription import subscription_accept_change
from dunning.acceptance.transitions import cycle_accept_transition
from dunning.actions.incidents import (
    CohortOutcome,
    IncidentError,
    incident_end,
    incident_start,
    previous_policy_version,
)
from dunning.clock import trusted_now
from dunning.evidence.fresh_fetch import invoice_fetch_fresh, receipt_evidence
from dunning.evidence.next_edge import invoice_facts, invoice_update
from dunning.evidence.receipts import receipt_record
from dunning.models import DunningCycle, IncidentSwitch, ProviderReceipt
from dunning.reads.cycles import cycle_read
from subscriptions.models import Subscription
from subscriptions.providers.base import PaymentProvider, ProviderError
from subscriptions.providers.registry import get_provider


def _accept(*, cycle: DunningCycle, edge: str, user: Any, reason: str, ticket: str, now: datetime | None,
            params: dict[str, Any] | None = None, evidence: Any = None) -> TransitionResult:
    return cycle_accept_transition(
        cycle_pk=cycle.pk, edge=edge, expect=Expect.from_cycle(cycle),
        cause=Cause.staff(user, reason=reason, ticket=ticket), evidence=evidence, params=params or {}, now=now,
    )


def cycle_grant_exception(*, cycle_pk: int, user: Any, expires_at: datetime, reason: str, ticket: str,
                          owner: str = "", profile: str | None = None, now: datetime | None = None
                          ) -> TransitionResult:
    """Suspend the cycle's dunning until `expires_at` (bounded by the policy's exceptions.max_duration)."""
    params: dict[str, Any] = {"expires_at": expires_at, "owner": owner}
    if profile:
        params["profile"] = profile
    return _accept(cycle=cycle_read(cycle_pk), edge="grant_exception", user=user, reason=reason, ticket=ticket,
                   now=now, params=params)


@dataclass(frozen=True)
class ConflictDecision:
    result: TransitionResult
    fresh_receipt: ProviderReceipt | None


def cycle_resolve_conflict(*, cycle_pk: int, user: Any, resolution: str, reason: str, ticket: str,
                           now: datetime | None = None, provider: PaymentProvider | None = None
                           ) -> ConflictDecision:
    """Fetch the invoice fresh from the provider, then decide the conflict on that receipt.
    The acceptance guard refuses a resolution the fresh receipt contradicts."""
    cycle = cycle_read(cycle_pk)
    try:
        inv, receipt = invoice_fetch_fresh(cycle, provider)
    except ProviderError as exc:
        refused = TransitionResult(accepted=False, edge="resolve_conflict", reason="PROVIDER_UNAVAILABLE",
                                   detail=f"the payment provider did not answer the fresh fetch: {exc}")
        return ConflictDecision(refused, None)
    result = _accept(cycle=cycle, edge="resolve_conflict", user=user, reason=reason, ticket=ticket,
                     now=now or trusted_now(), params={"resolution": resolution},
                     evidence=receipt_evidence(inv, receipt))
    return ConflictDecision(result, receipt)


def cycle_conflict_fresh_receipt(*, cycle_pk: int, provider: PaymentProvider | None = None
                                 ) -> ProviderReceipt | None:
    """A fresh fetch to show beside the conflict before anyone decides (stored as evidence)."""
    try:
        return invoice_fetch_fresh(cycle_read(cycle_pk), provider)[1]
    except ProviderError:
        return None


def cycle_take_unknown_ownership(*, cycle_pk: int, user: Any, reason: str, ticket: str,
                                 now: datetime | None = None) -> TransitionResult:
    return _accept(cycle=cycle_read(cycle_pk), edge="assign_unknown_owner", user=user, reason=reason, ticket=ticket,
                   now=now, params={"owner": user})


def cycle_request_cancellation(*, cycle_pk: int, user: Any, reason: str, ticket: str,
                               now: datetime | None = None) -> TransitionResult:
    return _accept(cycle=cycle_read(cycle_pk), edge="request_cancellation", user=user, reason=reason, ticket=ticket,
                   now=now)


def subscription_pause_restrictions(*, subscription_pk: int, user: Any, reason: str, ticket: str,
                                    now: datetime | None = None) -> IncidentSwitch:
    """Start the incident switch for the subscription's cohort. Raises IncidentError with the reason."""
    cohort = Subscription.objects.values_list("cohort", flat=True).get(pk=subscription_pk)
    return incident_start(user=user, reason=reason, ticket=ticket, cohort=cohort, now=now)


def subscription_end_incident(*, subscription_pk: int, user: Any, reason: str, ticket: str,
                               now: datetime | None = None) -> tuple[IncidentSwitch, CohortOutcome]:
    """End the incident pausing this subscription's cohort; every subscription of that cohort gets a
    fresh entitlement generation. Raises IncidentError when no incident is open."""
    cohort = Subscription.objects.values_list("cohort", flat=True).get(pk=subscription_pk)
    switch = (IncidentSwitch.objects.filter(ended_at__isnull=True, cohort__in=(cohort, "*"))
              .order_by("started_at").first())
    if switch is None:
        raise IncidentError(f"no incident pauses restrictions for cohort {cohort!r}")
    return switch, incident_end(switch=switch, user=user, reason=f"{reason} ({ticket})", now=now)


def subscription_rebind_to_previous(*, subscription_pk: int, user: Any, reason: str, ticket: str,
                                    now: datetime | None = None) -> TransitionResult:
    """Bind this one subscription (and its open cycles) to the version published before its policy."""
    if not reason.strip() or not ticket.strip():
        raise IncidentError("a rebind needs a reason and a ticket reference")
    sub = Subscription.objects.select_related("policy").get(pk=subscription_pk)
    target = previous_policy_version(sub.policy)
    return subscription_accept_change(
        subscription_pk=sub.pk, change="rebind_policy", expect_root=sub.outstanding_cycle_root,
        cause=Cause.staff(user, reason=reason, ticket=ticket), policy_pk=target.pk, now=now,
    )


UNKNOWN_DECISIONS = ("PAID", "FAILED")


def cycle_resolve_unknown(*, cycle_pk: int, user: Any, decision: str, reason: str, ticket: str,
                          now: datetime | None = None, provider: PaymentProvider | None = None) -> ConflictDecision:
    """A person resolves a payment whose outcome is unknown and whose idempotency key the provider
    no longer keeps, so asking again under it is impossible. Only the owner or a billing lead may.

    The invoice and its payments are fetched fresh first; the decision must agree with them (PAID
    needs a paid invoice; FAILED needs an unpaid invoice none of whose payments succeeded). The
    same attempt is resolved (SUCCEEDED through `recover`, FAILED through `retry_failed`), never
    replaced by a new one; a failed one returns the cycle to grace, whose deadline then applies."""
    cycle = cycle_read(cycle_pk)

    def refused(code: str, detail: str, receipt: ProviderReceipt | None = None) -> ConflictDecision:
        return ConflictDecision(TransitionResult(accepted=False, edge="resolve_unknown", reason=code, detail=detail),
                                receipt)

    if decision not in UNKNOWN_DECISIONS:
        return refused("UNKNOWN_DECISION", f"decide one of {', '.join(UNKNOWN_DECISIONS)}")
    if cycle.state != "PAYMENT_UNKNOWN":
        return refused("NOT_UNKNOWN", f"this payment is not unknown any more (cycle is {cycle.state})")
    if cycle.unknown_owner_id != getattr(user, "pk", None) and not user.has_perm("dunning.resolve_conflict"):
        return refused("NOT_THE_OWNER", "only the owner of this unknown payment or a billing lead may resolve it")
    provider = provider or get_provider(cycle.subscription.provider)
    try:
        inv, receipt = invoice_fetch_fresh(cycle, provider)
        payments = [provider.fetch_payment(ref) for ref in inv.payment_refs]
    except ProviderError as exc:
        return refused("PROVIDER_UNAVAILABLE", f"the payment provider did not answer the fresh fetch: {exc}")
    for payment in payments:
        receipt_record(object_type=payment.object or "payment", body=payment.raw or {"id": payment.id},
                       invoice=cycle.invoice, fetched_at=trusted_now())
    succeeded = [p.id for p in payments if p.status == "succeeded"]
    now = now or trusted_now()
    if decision == "PAID":
        evidence = Evidence(receipt=receipt, invoice=invoice_update(inv),
                            facts=invoice_facts(inv, decline_code="", now=now))
        ref = succeeded[-1] if succeeded else (inv.payment_refs[-1] if inv.payment_refs else "")
        result = _accept(cycle=cycle, edge="recover", user=user, reason=reason, ticket=ticket, now=now,
                         params={"provider_payment_ref": ref}, evidence=evidence)
        return ConflictDecision(result, receipt)
    if succeeded:
        return refused("DECISION_CONTRADICTS_RECEIPT", f"payment {', '.join(succeeded)} of this invoice succeeded at "
                                                       "the provider; it is not a failure", receipt)
    failed = _accept(cycle=cycle, edge="retry_failed", user=user, reason=reason, ticket=ticket, now=now,
                     params={"decline_code": "unknown_outcome_resolved_as_failed", "failure_class": "RETRYABLE"},
                     evidence=receipt_evidence(inv, receipt))
    if failed.accepted:
        _accept(cycle=cycle_read(cycle_pk), edge="return_to_grace", user=user, reason=reason, ticket=ticket, now=now)
    return ConflictDecision(failed, receipt)
