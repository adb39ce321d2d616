"""From a fresh invoice receipt to the next edge of a cycle (SPEC §5, §8).

`plan_next_step` is pure over the cycle and the provider's invoice: it never reads the event
body, so arrival order cannot matter. The loop in `cycle_reconcile_with_invoice` applies one
step at a time through the acceptance service until the cycle agrees with the receipt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from dunning.acceptance.guards import STALE_REFUSALS
from dunning.acceptance.inputs import Cause, Evidence, Expect, FactSpec, InvoiceUpdate, TransitionResult
from dunning.acceptance.transitions import cycle_accept_transition
from dunning.models import DunningCycle, FactKind, ProviderReceipt
from dunning.policy.cache import policy_spec
from dunning.reads.cycles import cycle_read
from dunning.reads.facts import facts_on_record
from dunning.states import NO_RETRY_CLASSES, CycleState, FailureClass
from subscriptions.providers.base import ProviderInvoice

S = CycleState
MAX_STEPS = 10


@dataclass(frozen=True)
class Step:
    edge: str
    params: dict[str, Any] = field(default_factory=dict)


def invoice_update(inv: ProviderInvoice) -> InvoiceUpdate:
    return InvoiceUpdate(status=inv.status, amount_due=inv.amount_due, amount_paid=inv.amount_paid,
                         attempt_count=inv.attempt_count, next_payment_attempt=inv.next_payment_attempt)


def invoice_facts(inv: ProviderInvoice, *, decline_code: str, now: datetime) -> tuple[FactSpec, ...]:
    """Money facts the invoice receipt itself proves. Dedupe keys make re-deriving harmless."""
    ref = inv.payment_refs[-1] if inv.payment_refs else ""
    facts: list[FactSpec] = []
    if inv.status == "paid":
        facts.append(FactSpec(FactKind.PAYMENT_SUCCEEDED, inv.amount_paid or inv.amount_due, inv.currency,
                              f"paid:{inv.id}", now, provider_ref=ref))
    elif inv.status == "void":
        facts.append(FactSpec(FactKind.INVOICE_VOIDED, inv.amount_due, inv.currency, f"void:{inv.id}", now))
    elif inv.status in ("open", "uncollectible") and inv.attempt_count > 0:
        facts.append(FactSpec(FactKind.PAYMENT_FAILED, inv.amount_due, inv.currency,
                              f"failed:{inv.id}:{inv.attempt_count}", now, provider_ref=ref,
                              decline_code=decline_code))
    if inv.status == "uncollectible":
        facts.append(FactSpec(FactKind.MARKED_UNCOLLECTIBLE, inv.amount_due, inv.currency,
                              f"uncollectible:{inv.id}", now))
    return tuple(facts)


def _mirror_differs(cycle: DunningCycle, inv: ProviderInvoice, facts: tuple[FactSpec, ...], *,
                    facts_applied: bool) -> bool:
    local = cycle.invoice
    if (local.status, local.amount_paid, local.attempt_count, local.next_payment_attempt) != (
        inv.status, inv.amount_paid, inv.attempt_count, inv.next_payment_attempt
    ):
        return True
    if facts_applied:
        # An acceptance of this walk applied these facts: each is on record now, or was found
        # to add nothing (a refund total already on record); applying them again adds nothing.
        return False
    keys = [f.dedupe_key for f in facts]
    return facts_on_record(keys) != len(keys)


def plan_next_step(cycle: DunningCycle, inv: ProviderInvoice, *, decline_code: str,
                   facts: tuple[FactSpec, ...], facts_applied: bool = False, state: str = "") -> Step | None:
    """`state`: plan as if the cycle stood there (an edge about to be taken moves only its state)."""
    state = state or cycle.state
    spec = policy_spec(cycle.policy)
    local = cycle.invoice
    settled_or_held = state in (S.RECOVERED, S.CLOSED_VOID, S.CANCELED, S.EVIDENCE_CONFLICT)
    if settled_or_held or (cycle.dispute_reopened and inv.status == "paid"):
        # A paid receipt does not settle debt reopened by a lost dispute; the grace path goes on.
        if cycle.dispute_reopened and state == S.PAYMENT_FAILED:
            return Step("start_grace")
        return Step("record_evidence") if _mirror_differs(cycle, inv, facts, facts_applied=facts_applied) else None
    if inv.status == "paid":
        return Step("recover", {"provider_payment_ref": inv.payment_refs[-1] if inv.payment_refs else ""})
    if inv.status == "void":
        return Step("close_void")
    new_failure = inv.attempt_count > local.attempt_count
    failure = {"decline_code": decline_code, "attempt_number": inv.attempt_count,
               "provider_payment_ref": inv.payment_refs[-1] if inv.payment_refs else ""}
    if inv.status in ("open", "uncollectible") and inv.attempt_count > 0:
        if state == S.CURRENT:
            return Step("record_failure", failure)
        if state == S.PAYMENT_FAILED:
            return Step("start_grace")
        if state == S.RETRY_FAILED:
            return Step("return_to_grace")
        provider_retries = spec.retry_authority == "PAYMENT_PROVIDER"
        if state == S.RETRY_SCHEDULED and provider_retries and new_failure:
            return Step("retry_failed", failure)
        if state == S.GRACE_ACTIVE and provider_retries and inv.next_payment_attempt and not new_failure:
            failure_class = cycle.failure_class or FailureClass.RETRYABLE
            if failure_class not in NO_RETRY_CLASSES and not cycle.customer_action_required:
                return Step("schedule_retry", {"next_attempt_at": inv.next_payment_attempt})
        if (state == S.RETRY_SCHEDULED and provider_retries and not new_failure
                and inv.next_payment_attempt != cycle.next_attempt_at):
            return Step("reschedule_retry", {"next_attempt_at": inv.next_payment_attempt})
    return Step("record_evidence") if _mirror_differs(cycle, inv, facts, facts_applied=facts_applied) else None


def cycle_reconcile_with_invoice(
    *, cycle_pk: int, inv: ProviderInvoice, receipt: ProviderReceipt, decline_code: str, cause: Cause,
    now: datetime, extra_facts: tuple[FactSpec, ...] = (), cycle: DunningCycle | None = None,
) -> list[TransitionResult]:
    """Walk the cycle towards what the receipt shows, one accepted edge at a time."""
    return reconcile_and_read(cycle_pk=cycle_pk, inv=inv, receipt=receipt, decline_code=decline_code, cause=cause,
                              now=now, extra_facts=extra_facts, cycle=cycle)[0]


def reconcile_and_read(
    *, cycle_pk: int, inv: ProviderInvoice, receipt: ProviderReceipt, decline_code: str, cause: Cause,
    now: datetime, extra_facts: tuple[FactSpec, ...] = (), cycle: DunningCycle | None = None,
) -> tuple[list[TransitionResult], DunningCycle | None]:
    """`cycle_reconcile_with_invoice`, also returning the cycle as it stands after the walk (as
    the last accepted step left it, or as read when nothing moved it), so a caller acting next
    need not read it again; None when the walk gave up after MAX_STEPS. `cycle`: the caller's
    read of it (as `cycle_read` loads it) to plan the first step from; the acceptance's
    compare-and-set refuses a step planned on a stale one, and the walk reads it again."""
    facts = invoice_facts(inv, decline_code=decline_code, now=now) + extra_facts
    evidence = Evidence(receipt=receipt, invoice=invoice_update(inv), facts=facts)
    results: list[TransitionResult] = []
    for _ in range(MAX_STEPS):
        cycle = cycle or cycle_read(cycle_pk)
        step = plan_next_step(cycle, inv, decline_code=decline_code, facts=facts,
                              facts_applied=any(r.accepted for r in results))
        if step is None:
            return results, cycle
        result = cycle_accept_transition(cycle_pk=cycle_pk, edge=step.edge, expect=Expect.from_cycle(cycle),
                                         cause=cause, evidence=evidence, params=step.params, now=now)
        results.append(result)
        if not result.accepted and result.reason not in STALE_REFUSALS:
            return results, cycle
        cycle = result.cycle  # None after a stale refusal: read the row again
    return results, None
