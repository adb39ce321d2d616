"""Guards of the cycle edges (SPEC §5), each refusing with a named reason.

A guard reads the locked rows, the validated policy, the evidence and the trusted time; it
never writes. Refusals become rejection receipts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cache
from typing import Any

from django.conf import settings
from django.db import connection

from dunning.acceptance.inputs import Cause, Evidence
from dunning.acceptance.locked_read import active_incident_sql, row_loader
from dunning.models import CauseKind, DunningCycle, IncidentSwitch, PaymentAttempt
from dunning.policy.document import PolicyDocument
from dunning.states import NO_RETRY_CLASSES, PENDING_ATTEMPT_STATES
from entitlements.profiles import PROFILES
from subscriptions.models import Invoice, Subscription

UNPAID_STATUSES = ("open", "uncollectible")
# Refusals that only say another acceptance got there first: read the rows again and decide anew.
STALE_REFUSALS = frozenset({"STALE_CYCLE_GENERATION", "STALE_INVOICE_REVISION", "STALE_ROOT", "STALE_ATTEMPT"})


class Refusal(Exception):
    def __init__(self, code: str, detail: str = "") -> None:
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code
        self.detail = detail


def refuse(code: str, detail: str = "") -> None:
    raise Refusal(code, detail)


@dataclass
class EdgeContext:
    cycle: DunningCycle
    subscription: Subscription
    invoice: Invoice
    spec: PolicyDocument
    now: datetime
    cause: Cause
    evidence: Evidence
    params: dict[str, Any]
    pending_attempt: PaymentAttempt | None
    notes: list[str] = field(default_factory=list)
    # Outbox rows the edge asks for, written with its receipt: (topic, dedupe key, payload).
    side_effects: list[tuple[str, str, dict]] = field(default_factory=list)
    # The invoice mirror's status before this acceptance applied the evidence.
    invoice_status_before: str = ""
    # The incident pausing restrictions as the acceptance's locked read found it (None: none);
    # when `incident_read` is False the guard asks `active_incident` itself.
    incident: IncidentSwitch | None = None
    incident_read: bool = False

    def param(self, name: str, *, required: bool = True, default: Any = None) -> Any:
        if name in self.params:
            return self.params[name]
        if required:
            refuse("MISSING_PARAMETER", f"edge needs {name!r}")
        return default


def fresh_receipt_max_age() -> timedelta:
    return timedelta(seconds=getattr(settings, "DUNNING_FRESH_RECEIPT_MAX_AGE_SECONDS", 300))


def require_fresh_invoice_receipt(ctx: EdgeContext, statuses: Iterable[str], code: str) -> None:
    """The edge needs a fresh provider fetch of this invoice showing one of `statuses`."""
    receipt = ctx.evidence.receipt
    if receipt is None:
        refuse("FRESH_RECEIPT_REQUIRED", "this edge needs a fresh provider receipt of the invoice")
    if receipt.object_type != "invoice" or receipt.object_id != ctx.invoice.provider_invoice_id:
        refuse("RECEIPT_NOT_FOR_THIS_INVOICE", f"receipt is for {receipt.object_type} {receipt.object_id}")
    age = ctx.now - receipt.fetched_at
    limit = fresh_receipt_max_age()
    if age > limit or age < -limit:
        refuse("RECEIPT_NOT_FRESH", f"receipt fetched {age.total_seconds():.0f}s from trusted now; limit {limit}")
    allowed = tuple(statuses)
    if receipt.status not in allowed:
        refuse(code, f"fresh receipt shows invoice {receipt.status}, edge needs {'/'.join(allowed)}")


def require_no_pending_attempt(ctx: EdgeContext) -> None:
    attempt = ctx.pending_attempt
    if attempt is not None and attempt.state in PENDING_ATTEMPT_STATES:
        refuse("ATTEMPT_PENDING", f"attempt {attempt.operation_id} is {attempt.state}")


def attempts_made(cycle: DunningCycle, *, retry_authority: str, invoice: Invoice | None = None) -> int:
    """The attempts a cycle has used against its policy's budget: the provider's own count when the
    provider retries, else the first charge plus our local retries. `invoice` is the row to read
    the provider's count from (the cycle's own by default)."""
    if retry_authority == "PAYMENT_PROVIDER":
        return max((invoice if invoice is not None else cycle.invoice).attempt_count, 1)
    return 1 + cycle.retry_budget_used


def require_retry_allowed(ctx: EdgeContext) -> None:
    if ctx.cycle.failure_class in NO_RETRY_CLASSES or ctx.cycle.customer_action_required:
        refuse("NON_RETRYABLE_NO_RETRY",
               f"failure class {ctx.cycle.failure_class or 'unknown'} needs customer action, not a retry")
    made = attempts_made(ctx.cycle, retry_authority=ctx.spec.retry_authority, invoice=ctx.invoice)
    if made >= ctx.spec.max_attempts:
        refuse("ATTEMPT_BUDGET_EXHAUSTED", f"{made} of {ctx.spec.max_attempts} attempts used")


def require_staff_decision(ctx: EdgeContext) -> None:
    cause = ctx.cause
    if cause.kind != CauseKind.USER or cause.user is None:
        refuse("MANUAL_DECISION_REQUIRED", "only a support decision may take this edge")
    if not cause.reason.strip() or not cause.ticket.strip():
        refuse("REASON_AND_TICKET_REQUIRED", "a support decision needs a reason and a ticket reference")


def require_profile(name: str) -> None:
    if name not in PROFILES:
        refuse("UNKNOWN_PROFILE", f"{name!r} is not an entitlement profile")


# `active_incident` by hand on PostgreSQL: a grace sweep asks before its fetch, and the ORM
# compiled the query each time. (The guard inside an acceptance reads it from the locked read.)
@cache
def _active_incident_sql() -> str:
    return active_incident_sql("%(cohort)s")


def active_incident(cohort: str) -> IncidentSwitch | None:
    """The earliest active incident that pauses restrictions for `cohort` (its own or "*")."""
    if connection.vendor != "postgresql":
        return (IncidentSwitch.objects.filter(ended_at__isnull=True, pause_restrictions=True,
                                              cohort__in=("*", cohort)).order_by("started_at", "pk").first())
    with connection.cursor() as cursor:
        cursor.execute(_active_incident_sql(), {"cohort": cohort})
        row = cursor.fetchone()
    return row_loader(IncidentSwitch, "x").load(row) if row is not None else None


def require_restrictions_not_paused(ctx: EdgeContext) -> None:
    """An incident switch pauses new restrictions and automatic cancellations (SPEC §15)."""
    incident = ctx.incident if ctx.incident_read else active_incident(ctx.subscription.cohort)
    if incident is not None:
        refuse("RESTRICTIONS_PAUSED", f"incident {incident.ticket} pauses new restrictions since "
                                      f"{incident.started_at.isoformat()}: {incident.reason}")
