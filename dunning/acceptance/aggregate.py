"""Pure computations over a subscription's cycles: blocking set, outstanding root, decision (SPEC §7).

Kept free of database access so the acceptance service, the auditor and the gates all
compute the same thing from the same inputs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from dunning.policy.document import PolicyDocument
from dunning.states import (
    DELINQUENT_STATES,
    GRACE_PROFILE_STATES,
    RESTRICTED_PROFILE_STATES,
    CycleState,
)
from entitlements.profiles import FULL, REVOKED, most_restrictive

EMPTY_ROOT = hashlib.sha256(b"dunning:no-outstanding-debt").hexdigest()


@dataclass(frozen=True)
class CycleView:
    cycle_id: str
    generation: int
    state: str
    invoice_status: str
    dispute_reopened: bool
    exception_profile: str
    conflict_held_profile: str
    spec: PolicyDocument


def is_blocking(view: CycleView) -> bool:
    if view.state not in DELINQUENT_STATES:
        return False
    if view.dispute_reopened and view.spec.dispute_lost == "BLOCKING":
        return True
    return view.spec.invoice_status_mapping.get(view.invoice_status, "BLOCKING") == "BLOCKING"


def outstanding_root(views: Iterable[CycleView]) -> str:
    blocking = sorted((v.cycle_id, v.generation) for v in views if is_blocking(v))
    if not blocking:
        return EMPTY_ROOT
    text = "\n".join(f"{cycle_id}:{generation}" for cycle_id, generation in blocking)
    return hashlib.sha256(text.encode()).hexdigest()


def profile_asked_by(view: CycleView) -> str | None:
    """The profile one blocking cycle asks for; None when it asks for nothing."""
    if not is_blocking(view):
        return None
    state = view.state
    if state in GRACE_PROFILE_STATES:
        return view.spec.grace_profile
    if state in RESTRICTED_PROFILE_STATES:
        return view.spec.restricted_profile
    if state == CycleState.CANCELED:
        return REVOKED
    if state == CycleState.EXCEPTION_ACTIVE:
        return view.exception_profile or FULL
    if state == CycleState.EVIDENCE_CONFLICT:
        return view.conflict_held_profile or None
    return None


@dataclass(frozen=True)
class Decision:
    profile: str
    reason: str
    blocking_count: int


def aggregate_decision(views: Iterable[CycleView], *, recover_with_remaining_debt: bool) -> Decision:
    views = list(views)
    blocking = [v for v in views if is_blocking(v)]
    if not blocking:
        return Decision(FULL, "no outstanding debt", 0)
    if recover_with_remaining_debt and not any(
        v.state in (CycleState.EVIDENCE_CONFLICT, CycleState.CANCELED) for v in blocking
    ):
        return Decision(FULL, "policy allows recovery with remaining debt", len(blocking))
    asked = [(p, v) for v in blocking if (p := profile_asked_by(v))]
    profile = most_restrictive(p for p, _ in asked) or FULL
    driver = next(v for p, v in asked if p == profile) if asked else blocking[0]
    return Decision(profile, f"{len(blocking)} blocking cycle(s); strictest is {driver.state}", len(blocking))
