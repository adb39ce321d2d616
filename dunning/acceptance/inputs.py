"""Typed inputs and outputs of the acceptance service."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from dunning.models import CauseKind, DunningCycle
from subscriptions.providers.base import ProviderSubscription


@dataclass(frozen=True)
class Cause:
    """Who or what asked for the transition. Every write names one."""

    kind: str
    ref: str = ""
    actor: str = "system"
    user: Any = None
    reason: str = ""
    ticket: str = ""

    @classmethod
    def event(cls, event_id: str) -> Cause:
        return cls(kind=CauseKind.EVENT, ref=event_id, actor="webhook")

    @classmethod
    def job(cls, name: str, run_ref: str = "") -> Cause:
        return cls(kind=CauseKind.JOB, ref=run_ref or name, actor=f"job:{name}")

    @classmethod
    def staff(cls, user: Any, *, reason: str, ticket: str) -> Cause:
        return cls(kind=CauseKind.USER, ref=ticket, actor=user.get_username(), user=user,
                   reason=reason, ticket=ticket)

    @classmethod
    def customer(cls, user: Any) -> Cause:
        return cls(kind=CauseKind.CUSTOMER, ref="", actor=f"customer:{user.get_username()}", user=user)

    @classmethod
    def system(cls, what: str) -> Cause:
        return cls(kind=CauseKind.SYSTEM, ref=what, actor="system")


@dataclass(frozen=True)
class Expect:
    """Compare-and-set inputs: what the caller saw when it decided to ask (SPEC §6.1)."""

    cycle_generation: int
    invoice_revision: int
    attempt_id: UUID | None
    policy_id: int
    root: str

    @classmethod
    def from_cycle(cls, cycle: DunningCycle) -> Expect:
        attempt_id = cycle.pending_attempt.operation_id if cycle.pending_attempt_id else None
        return cls(
            cycle_generation=cycle.generation,
            invoice_revision=cycle.invoice.revision,
            attempt_id=attempt_id,
            policy_id=cycle.policy_id,
            root=cycle.subscription.outstanding_cycle_root,
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "cycle_generation": self.cycle_generation,
            "invoice_revision": self.invoice_revision,
            "attempt_id": str(self.attempt_id) if self.attempt_id else None,
            "policy_id": self.policy_id,
            "root": self.root,
        }


@dataclass(frozen=True)
class InvoiceUpdate:
    """Invoice fields as a fresh provider receipt shows them."""

    status: str
    amount_due: int
    amount_paid: int
    attempt_count: int
    next_payment_attempt: datetime | None


@dataclass(frozen=True)
class ContractUpdate:
    """The contract as one fresh provider fetch shows it, stamped with the fetch time (the fence:
    a read older than the newest one applied is refused, so it never rolls a contract back)."""

    status: str
    price_ids: tuple[str, ...]
    interval: str
    fetched_at: datetime
    cancel_at_period_end: bool = False
    current_period_end: datetime | None = None
    ended_at: datetime | None = None
    pause_behavior: str = ""
    pause_resumes_at: datetime | None = None
    trial_end: datetime | None = None
    plan_name: str = ""  # the first price's product name; "" when the provider could not say

    def mirror_fields(self) -> dict[str, Any]:
        """The Subscription columns this read sets (the contract line's mirror). A plan name the
        provider could not give keeps the one on record."""
        fields = {
            "provider_status": self.status, "cancel_at_period_end": self.cancel_at_period_end,
            "current_period_end": self.current_period_end, "contract_ended_at": self.ended_at,
            "pause_behavior": self.pause_behavior, "pause_resumes_at": self.pause_resumes_at,
            "trial_end": self.trial_end,
        }
        if self.plan_name:
            fields["plan_name"] = self.plan_name
        return fields

    @classmethod
    def from_provider(cls, remote: ProviderSubscription, *, fetched_at: datetime) -> ContractUpdate:
        ended = remote.ended_at or (remote.canceled_at if remote.status == "canceled" else None)
        return cls(status=remote.status, price_ids=tuple(remote.price_ids), interval=remote.interval or "month",
                   fetched_at=fetched_at, cancel_at_period_end=remote.cancel_at_period_end,
                   current_period_end=remote.current_period_end, ended_at=ended,
                   pause_behavior=remote.pause_behavior, pause_resumes_at=remote.pause_resumes_at,
                   trial_end=remote.trial_end)


@dataclass(frozen=True)
class FactSpec:
    kind: str
    amount: int
    currency: str
    dedupe_key: str
    occurred_at: datetime
    provider_ref: str = ""
    decline_code: str = ""


@dataclass(frozen=True)
class Evidence:
    """What a fresh fetch showed. The receipt row is stored before acceptance (it is evidence
    whatever the outcome); the invoice update and facts are applied inside it."""

    receipt: Any = None  # ProviderReceipt
    invoice: InvoiceUpdate | None = None
    facts: tuple[FactSpec, ...] = ()


@dataclass(frozen=True)
class StepRequest:
    """One edge of a multi-step acceptance (`cycle_accept_steps`): what `cycle_accept_transition`
    takes for one edge besides the cycle, its expectations, the cause and the time."""

    edge: str
    evidence: Evidence | None = None
    params: dict[str, Any] | None = None


@dataclass(frozen=True)
class TransitionResult:
    accepted: bool
    edge: str
    reason: str = ""
    detail: str = ""
    receipt_id: int | None = None
    from_state: str = ""
    to_state: str = ""
    cycle_generation: int | None = None
    root: str = ""
    profile: str = ""
    entitlement_generation: int | None = None
    snapshot_issued: bool = False
    facts_recorded: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    # The cycle as this accepted transition left it (invoice, subscription, pending attempt; its
    # policies carry only pk and digest, what `policy_spec` reads), so a caller deciding its next
    # step need not read the row again. The next acceptance's compare-and-set still checks it.
    # Of several steps accepted in one call, only the last carries it (the earlier steps' row is
    # the same object, moved on by the steps after them).
    cycle: DunningCycle | None = field(default=None, repr=False, compare=False)

    def __bool__(self) -> bool:
        return self.accepted
