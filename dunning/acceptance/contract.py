"""The contract line (seed 002: Contract/Subscription, apart from collection, retry, grace and
entitlement): what the provider subscription's state allows, as a pure function of its mirror
and the trusted time. The aggregate decision takes the stricter of this and the debt line.

Kept free of database access, like `dunning.acceptance.aggregate`, so the acceptance service, the gates and
the auditor compute the same phase from the same inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from dunning.policy.document import PolicyDocument
from dunning.policy.vocabulary import CONTRACT_STATES, ENDED_CONTRACT_STATES

ENDED = "canceled"


@dataclass(frozen=True)
class ContractView:
    status: str
    cancel_at_period_end: bool = False
    current_period_end: datetime | None = None
    ended_at: datetime | None = None
    pause_behavior: str = ""
    pause_resumes_at: datetime | None = None

    @classmethod
    def of(cls, subscription: object) -> ContractView:
        return cls(
            status=subscription.provider_status, cancel_at_period_end=subscription.cancel_at_period_end,
            current_period_end=subscription.current_period_end, ended_at=subscription.contract_ended_at,
            pause_behavior=subscription.pause_behavior, pause_resumes_at=subscription.pause_resumes_at,
        )


def contract_phase(view: ContractView, now: datetime) -> str:
    """The contract state access is decided on at `now`.

    An ended contract reads `canceled` whether the provider canceled it at once, its `ended_at`
    passed, or it was set to cancel at the period end and that end passed (the provider's own
    `customer.subscription.deleted` may still be on its way). A pause whose resume time passed
    reads as the status underneath it.
    """
    if view.status in ENDED_CONTRACT_STATES:
        return view.status
    if view.ended_at is not None and view.ended_at <= now:
        return ENDED
    if view.cancel_at_period_end and view.current_period_end is not None and view.current_period_end <= now:
        return ENDED
    paused = view.status == "paused" or bool(view.pause_behavior)
    if paused and (view.pause_resumes_at is None or view.pause_resumes_at > now):
        return "paused"
    if view.status == "paused":
        return "active"  # the resume time passed; the next fresh read will say what the provider did
    return view.status if view.status in CONTRACT_STATES else "active"


def is_ended(phase: str) -> bool:
    return phase in ENDED_CONTRACT_STATES


def contract_ceiling(phase: str, spec: PolicyDocument) -> str:
    """The most access the policy lets this contract state have."""
    return spec.contract_access.get(phase, "FULL")


def contract_says(view: ContractView, spec: PolicyDocument, now: datetime) -> tuple[str, str, str]:
    """(phase, ceiling profile, reason)."""
    phase = contract_phase(view, now)
    ceiling = contract_ceiling(phase, spec)
    if phase == ENDED:
        reason = "contract ended at the provider; export through support"
    elif phase == "paused":
        until = f" until {view.pause_resumes_at.isoformat()}" if view.pause_resumes_at else ""
        reason = f"contract paused{until}"
    else:
        reason = f"contract {phase}"
    if view.cancel_at_period_end and not is_ended(phase) and view.current_period_end is not None:
        reason += f"; cancels at period end {view.current_period_end.isoformat()}"
    return phase, ceiling, reason
