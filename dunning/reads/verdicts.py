"""Review verdicts (SPEC §14, seed 002): is a subscription's recovery state explainable and closed?

A pure evaluator. Plain frozen dataclasses go in (:class:`SubscriptionReview` with its
:class:`CycleReview` rows and :class:`PolicyFacts`), a :class:`Verdict` comes out:
``RECOVERY_REVIEW_READY`` or ``HOLD`` with one :class:`Blocker` per defect. No database, no
Django, no clock: the trusted ``now`` is part of the input, so the same input always gives the
same verdict, and blockers come out in one stable order whatever order the cycles were given in.

The evaluator is total: odd input (missing fields, naive datetimes, unknown states, a wrong
type) never raises; it becomes a ``HOLD_REVIEW_INPUT_INVALID`` or ``HOLD_UNKNOWN_CYCLE_STATE``
blocker, because a state nobody can read is not ready for review.

Only delinquent and settled (recovered or voided) cycles are judged; a subscription whose
cycles are all ``CURRENT`` (or that has none) is ready. The provider's own subscription status
is carried for display only and is never consulted: access follows the policy, not
``past_due`` (seed 002, failure mode 1).

``services/review.py`` builds the input from the database; tests build it by hand or derive it
from a loaded review with ``dataclasses.replace``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

# Cycle states as plain strings, from the Django-free list that dunning.states also builds on.
from dunning.state_names import (
    CANCEL_PENDING,
    CANCELED,
    CURRENT,
    DELINQUENT_STATES,
    EVIDENCE_CONFLICT,
    EXCEPTION_ACTIVE,
    GRACE_ACTIVE,
    GRACE_EXPIRED,
    PAYMENT_UNKNOWN,
    RESTRICTED,
    RESTRICTING,
    RETRY_DISPATCHING,
    RETRY_FAILED,
    RETRY_SCHEDULED,
    SETTLED_STATES,
)

__all__ = [
    "BLOCKER_CODES", "DUNNING_TEMPLATES", "HOLD", "READY", "Blocker", "CycleReview", "Notice", "PolicyFacts",
    "SubscriptionReview", "Verdict", "evaluate", "is_dunning_template",
]

READY = "RECOVERY_REVIEW_READY"
HOLD = "HOLD"

HOLD_REVIEW_INPUT_INVALID = "HOLD_REVIEW_INPUT_INVALID"
HOLD_MISSING_POLICY_VERSION = "HOLD_MISSING_POLICY_VERSION"
HOLD_POLICY_NOT_TRANSFERRED = "HOLD_POLICY_NOT_TRANSFERRED"
HOLD_UNKNOWN_CYCLE_STATE = "HOLD_UNKNOWN_CYCLE_STATE"
HOLD_MISSING_AUDIT_REF = "HOLD_MISSING_AUDIT_REF"
HOLD_EVIDENCE_CONFLICT = "HOLD_EVIDENCE_CONFLICT"
HOLD_NONRETRYABLE_RETRY_CONFLICT = "HOLD_NONRETRYABLE_RETRY_CONFLICT"
HOLD_CUSTOMER_ACTION_NOT_REQUIRED = "HOLD_CUSTOMER_ACTION_NOT_REQUIRED"
HOLD_ATTEMPTS_OVER_BUDGET = "HOLD_ATTEMPTS_OVER_BUDGET"
HOLD_GRACE_WITHOUT_EXPIRY = "HOLD_GRACE_WITHOUT_EXPIRY"
HOLD_GRACE_EXPIRED_ENTITLEMENT_NOT_RECOMPUTED = "HOLD_GRACE_EXPIRED_ENTITLEMENT_NOT_RECOMPUTED"
HOLD_ENTITLEMENT_NOT_FROM_POLICY = "HOLD_ENTITLEMENT_NOT_FROM_POLICY"
HOLD_OVERRIDE_INCOMPLETE = "HOLD_OVERRIDE_INCOMPLETE"
HOLD_DUNNING_AFTER_RECOVERY = "HOLD_DUNNING_AFTER_RECOVERY"

# The order blockers are reported in: input problems first, then policy identity, audit,
# retry, grace, entitlement, override and notification defects.
BLOCKER_CODES = (
    HOLD_REVIEW_INPUT_INVALID,
    HOLD_MISSING_POLICY_VERSION,
    HOLD_POLICY_NOT_TRANSFERRED,
    HOLD_UNKNOWN_CYCLE_STATE,
    HOLD_MISSING_AUDIT_REF,
    HOLD_EVIDENCE_CONFLICT,
    HOLD_NONRETRYABLE_RETRY_CONFLICT,
    HOLD_CUSTOMER_ACTION_NOT_REQUIRED,
    HOLD_ATTEMPTS_OVER_BUDGET,
    HOLD_GRACE_WITHOUT_EXPIRY,
    HOLD_GRACE_EXPIRED_ENTITLEMENT_NOT_RECOMPUTED,
    HOLD_ENTITLEMENT_NOT_FROM_POLICY,
    HOLD_OVERRIDE_INCOMPLETE,
    HOLD_DUNNING_AFTER_RECOVERY,
)
_RANK = {code: i for i, code in enumerate(BLOCKER_CODES)}

KNOWN_STATES = DELINQUENT_STATES | SETTLED_STATES | {CURRENT}
# Grace is running (the trusted clock decides whether it has run out).
IN_GRACE_STATES = frozenset({GRACE_ACTIVE, RETRY_SCHEDULED, RETRY_DISPATCHING, RETRY_FAILED, PAYMENT_UNKNOWN})
# Grace has been declared over by the sweep.
POST_GRACE_STATES = frozenset({GRACE_EXPIRED, RESTRICTING, RESTRICTED, CANCEL_PENDING, CANCELED})
# Every state a cycle reaches only through start_grace: it must carry a grace window.
GRACE_STARTED_STATES = IN_GRACE_STATES | POST_GRACE_STATES | {EXCEPTION_ACTIVE}

NO_RETRY_CLASSES = frozenset({"CUSTOMER_ACTION", "NON_RETRYABLE"})
FULL = "FULL"

# Notices that chase a payment. Requested for a cycle after it settled, they are dunning after
# recovery (seed 002 failure mode 6). Templates are also matched by name (…reminder…, …failed…)
# so a new reminder template is caught without editing this list.
DUNNING_TEMPLATES = frozenset({
    "payment_failed", "grace_reminder", "grace_ending", "retry_scheduled", "payment_retry",
    "access_restricted", "subscription_canceled", "dunning_reminder", "final_notice",
})
_DUNNING_NAME = re.compile(r"reminder|fail|dunning|overdue|past_due", re.IGNORECASE)
_IDENTITY = re.compile(r"[a-z0-9][a-z0-9-]*@[1-9][0-9]*")


def is_dunning_template(template: Any) -> bool:
    if not isinstance(template, str):
        return False
    return template in DUNNING_TEMPLATES or bool(_DUNNING_NAME.search(template))


@dataclass(frozen=True)
class PolicyFacts:
    """The facts of one published policy that a review needs."""

    identity: str | None  # name@version; None when the row carries no identity
    has_grace: bool
    grace_duration: timedelta | None
    grace_profile: str
    restricted_profile: str
    max_attempts: int | None  # None: no bounded budget
    retry_authority: str
    prices: tuple[str, ...] = ()
    is_default: bool = False

    @property
    def version(self) -> int | None:
        if not isinstance(self.identity, str) or not _IDENTITY.fullmatch(self.identity):
            return None
        return int(self.identity.rpartition("@")[2])


@dataclass(frozen=True)
class Notice:
    """One notification requested for a cycle (an outbox ``notification.requested`` row)."""

    template: str
    requested_at: datetime | None
    receipt_id: int | None = None  # the transition receipt that requested it, when there is one


@dataclass(frozen=True)
class CycleReview:
    cycle_id: str
    state: str
    policy: PolicyFacts | None  # the cycle's OWN policy (the one it was opened or rebound under)
    failure_class: str = ""
    customer_action_required: bool = False
    next_attempt_at: datetime | None = None
    attempts_made: int | None = None
    grace_started_at: datetime | None = None
    grace_expires_at: datetime | None = None
    exception_owner: str = ""
    exception_ticket: str = ""
    exception_reason: str = ""
    exception_expires_at: datetime | None = None
    exception_profile: str = ""
    suspended_state: str = ""  # what an active exception suspended
    settled_at: datetime | None = None
    settled_receipt_id: int | None = None  # the accepted receipt that moved it to RECOVERED/CLOSED_VOID
    audit_ref: int | None = None  # the latest accepted transition receipt of this cycle
    notices: tuple[Notice, ...] = ()
    invoice_ref: str = ""  # provider invoice id, for the detail text
    invoice_status: str = ""
    invoice_prices: tuple[str, ...] = ()  # the invoice's own line prices, which pick the cycle's policy


@dataclass(frozen=True)
class SubscriptionReview:
    subscription_id: str
    billing_interval: str
    price_id: str
    entitlement_profile: str  # the profile currently issued
    policy: PolicyFacts | None  # the policy the subscription is bound to
    now: datetime  # the trusted clock
    cycles: tuple[CycleReview, ...] = ()
    expected_profile: str | None = None  # the §7 aggregate decision over the stored cycles, if known
    enforces_access: bool = True  # False in SHADOW / NOTIFY_ONLY or outside the rollout
    provider_status: str = ""  # display only; never decides anything
    provider_subscription_id: str = ""  # display only


@dataclass(frozen=True)
class Blocker:
    code: str
    detail: str
    cycle_id: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "detail": self.detail, "cycle": self.cycle_id}


@dataclass(frozen=True)
class Verdict:
    status: str
    blockers: tuple[Blocker, ...] = ()

    @property
    def ready(self) -> bool:
        return self.status == READY

    @property
    def codes(self) -> tuple[str, ...]:
        return tuple(b.code for b in self.blockers)

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.status, "blockers": [b.as_dict() for b in self.blockers]}


def evaluate(review: SubscriptionReview) -> Verdict:
    """The verdict for one subscription. Never raises."""
    found: list[Blocker] = []
    try:
        found.extend(_subscription_blockers(review))
        cycles = _cycles_of(review, found)
        for cycle in cycles:
            try:
                found.extend(_cycle_blockers(review, cycle))
            except Exception as exc:  # total by design: odd input holds, never raises
                found.append(Blocker(HOLD_REVIEW_INPUT_INVALID,
                                     f"{_name(cycle)}: its review data could not be read ({type(exc).__name__})",
                                     _cycle_id(cycle)))
    except Exception as exc:  # total by design
        found.append(Blocker(HOLD_REVIEW_INPUT_INVALID,
                             f"the subscription review could not be read ({type(exc).__name__})"))
    blockers = _ordered(found)
    return Verdict(HOLD if blockers else READY, blockers)


# --- subscription level ---------------------------------------------------------------------------

def _subscription_blockers(review: SubscriptionReview) -> list[Blocker]:
    if not isinstance(review, SubscriptionReview):
        return [Blocker(HOLD_REVIEW_INPUT_INVALID, f"expected a SubscriptionReview, got {type(review).__name__}")]
    out: list[Blocker] = []
    who = _subscription_name(review)
    if not _is_datetime(review.now):
        out.append(Blocker(HOLD_REVIEW_INPUT_INVALID, f"{who}: no trusted time to judge grace and exceptions by"))
    policy = review.policy
    if not isinstance(policy, PolicyFacts):
        out.append(Blocker(HOLD_MISSING_POLICY_VERSION, f"{who} is bound to no policy version"))
        return out
    if policy.version is None:
        out.append(Blocker(HOLD_MISSING_POLICY_VERSION,
                           f"{who} is bound to a policy without a name@version identity ({policy.identity!r})"))
    prices = policy.prices if isinstance(policy.prices, tuple | list | frozenset | set) else ()
    if not policy.is_default and review.price_id not in prices:
        out.append(Blocker(
            HOLD_POLICY_NOT_TRANSFERRED,
            f"{who} (price {review.price_id}, billed per {review.billing_interval}) is bound to "
            f"{policy.identity}, which applies to {', '.join(map(str, prices)) or 'no price'} and is not the "
            "default policy: its behaviour was copied, not transferred",
        ))
    if (review.enforces_access is True and isinstance(review.expected_profile, str) and review.expected_profile
            and review.entitlement_profile != review.expected_profile):
        out.append(Blocker(
            HOLD_ENTITLEMENT_NOT_FROM_POLICY,
            f"{who} holds entitlement {review.entitlement_profile} but its cycles and policies ask for "
            f"{review.expected_profile}; access must come from the policy decision, not from provider status",
        ))
    return out


def _cycles_of(review: SubscriptionReview, found: list[Blocker]) -> list[CycleReview]:
    if not isinstance(review, SubscriptionReview):
        return []
    raw = review.cycles
    if not isinstance(raw, Iterable) or isinstance(raw, str | bytes):
        found.append(Blocker(HOLD_REVIEW_INPUT_INVALID, f"{_subscription_name(review)}: cycles unreadable"))
        return []
    cycles: list[CycleReview] = []
    for item in raw:
        if isinstance(item, CycleReview):
            cycles.append(item)
        else:
            found.append(Blocker(HOLD_REVIEW_INPUT_INVALID,
                                 f"{_subscription_name(review)}: a cycle entry is a {type(item).__name__}"))
    return cycles


# --- cycle level ----------------------------------------------------------------------------------

def _cycle_blockers(review: SubscriptionReview, c: CycleReview) -> list[Blocker]:
    state = c.state
    if state == CURRENT:
        return []  # healthy: nothing failed yet
    cid = _cycle_id(c)
    name = _name(c)
    if state not in KNOWN_STATES:
        return [Blocker(HOLD_UNKNOWN_CYCLE_STATE, f"{name} is in an unknown state {state!r}", cid)]
    own = c.policy if isinstance(c.policy, PolicyFacts) else None
    judged = _Judged(
        review=review, c=c, state=state, now=review.now if _is_datetime(review.now) else None, own=own,
        policy=own or (review.policy if isinstance(review.policy, PolicyFacts) else None),
    )
    return [Blocker(code, f"{name} {detail}", cid) for check in _CYCLE_CHECKS for code, detail in check(judged)]


@dataclass(frozen=True)
class _Judged:
    """One readable, non-CURRENT cycle under review, with what its checks share."""

    review: SubscriptionReview
    c: CycleReview
    state: str
    now: datetime | None  # the trusted time, when the input has a readable one
    own: PolicyFacts | None  # the cycle's own policy
    policy: PolicyFacts | None  # its own, else the subscription's

    @property
    def open_cycle(self) -> bool:
        return self.state in DELINQUENT_STATES


_Holds = Iterator[tuple[str, str]]  # (blocker code, detail after the cycle's name)


def _explainability(j: _Judged) -> _Holds:
    """Which policy version, which accepted transition."""
    c, own, state = j.c, j.own, j.state
    if own is None:
        yield HOLD_MISSING_POLICY_VERSION, "records no policy version"
    elif own.version is None:
        yield HOLD_MISSING_POLICY_VERSION, f"records a policy without a name@version identity ({own.identity!r})"
    elif c.invoice_prices and not own.is_default and not set(c.invoice_prices) & set(own.prices or ()):
        yield (HOLD_POLICY_NOT_TRANSFERRED,
               f"bills {', '.join(c.invoice_prices)} but runs under {own.identity}, which applies to "
               f"{', '.join(map(str, own.prices or ())) or 'no price'}: the invoice's own price must pick its policy")
    if c.audit_ref is None:
        yield HOLD_MISSING_AUDIT_REF, f"is {state} but no accepted transition receipt explains how it got there"
    if state == EVIDENCE_CONFLICT:
        yield HOLD_EVIDENCE_CONFLICT, "holds contradicting evidence; a support decision must resolve it first"


def _retry_eligibility(j: _Judged) -> _Holds:
    c, state = j.c, j.state
    retry_pending = c.next_attempt_at is not None or state == RETRY_SCHEDULED
    no_retry = c.failure_class in NO_RETRY_CLASSES
    if retry_pending and (no_retry or c.customer_action_required is True):
        why = f"failure class {c.failure_class}" if no_retry else "customer action required"
        when = f" for {_when(c.next_attempt_at)}" if c.next_attempt_at is not None else ""
        yield (HOLD_NONRETRYABLE_RETRY_CONFLICT,
               f"has {why} yet a retry is still scheduled{when} (state {state}); a non-retryable failure turns "
               "retries off and needs a new payment method from the customer")
    elif no_retry and j.open_cycle and c.customer_action_required is not True:
        yield (HOLD_CUSTOMER_ACTION_NOT_REQUIRED,
               f"has failure class {c.failure_class} but does not ask the customer to act")


def _attempt_budget(j: _Judged) -> _Holds:
    policy = j.policy
    if policy is None:
        return
    budget = policy.max_attempts
    made = j.c.attempts_made
    bounded = isinstance(budget, int) and not isinstance(budget, bool) and budget >= 1
    known = isinstance(made, int) and not isinstance(made, bool) and made >= 0
    if not bounded:
        yield HOLD_ATTEMPTS_OVER_BUDGET, (f"runs under {policy.identity}, which sets no bounded attempt budget "
                                          f"(maxAttempts {budget!r})")
    elif not known:
        yield HOLD_ATTEMPTS_OVER_BUDGET, f"has an unknown number of attempts ({made!r}) against a budget of {budget}"
    elif made > budget:
        yield HOLD_ATTEMPTS_OVER_BUDGET, f"made {made} attempts, over the budget of {budget} in {policy.identity}"
    elif j.state == RETRY_SCHEDULED and made >= budget:
        yield HOLD_ATTEMPTS_OVER_BUDGET, (f"has another retry scheduled after all {budget} attempts of "
                                          f"{policy.identity} were used")


def _grace_boundary(j: _Judged) -> _Holds:
    c, own, policy, state = j.c, j.own, j.policy, j.state
    in_grace_path = state in GRACE_STARTED_STATES
    if policy is not None and in_grace_path and policy.has_grace is True and c.grace_expires_at is None:
        yield HOLD_GRACE_WITHOUT_EXPIRY, (f"is in grace ({state}) without a grace expiry although "
                                          f"{policy.identity} grants grace")
    if own is not None and c.grace_started_at is not None and c.grace_expires_at is not None:
        window = c.grace_expires_at - c.grace_started_at
        expected = own.grace_duration if own.has_grace is True else timedelta(0)
        if not isinstance(expected, timedelta) or window != expected:
            allowed = f"a grace of {_span(expected)}" if own.has_grace is True else "no grace (a zero-length window)"
            yield (HOLD_POLICY_NOT_TRANSFERRED,
                   f"has a grace window of {_span(window)} but its own policy {own.identity} allows {allowed}; "
                   "the window was copied from another policy instead of computed from this one")


def _entitlement_after_grace(j: _Judged) -> _Holds:
    c, state, now, review = j.c, j.state, j.now, j.review
    # A SHADOW / NOTIFY_ONLY policy (or a subscription outside the rollout) keeps access by design.
    still_full = review.entitlement_profile == FULL and j.open_cycle and review.enforces_access is not False
    if still_full and _grace_is_over(c, state, now) and not _exception_covers(c, state, now):
        yield (HOLD_GRACE_EXPIRED_ENTITLEMENT_NOT_RECOMPUTED,
               f"is past its grace (expiry {_when(c.grace_expires_at)}, state {state}) while the subscription "
               "still holds FULL access and no complete, unexpired exception covers it; the entitlement must be "
               "recomputed")


def _override_authority(j: _Judged) -> _Holds:
    c = j.c
    if j.state != EXCEPTION_ACTIVE:
        return
    missing = [label for label, value in (("owner", c.exception_owner), ("ticket reference", c.exception_ticket),
                                          ("reason", c.exception_reason)) if not _text(value)]
    if c.exception_expires_at is None:
        missing.append("expiry")
    if missing:
        yield HOLD_OVERRIDE_INCOMPLETE, (f"has an active exception without {_join(missing)}; an override needs an "
                                         "owner, a ticket reference, a reason and an expiry to carry authority")


def _dunning_after_recovery(j: _Judged) -> _Holds:
    c, state = j.c, j.state
    if state not in SETTLED_STATES:
        return
    late = sorted({n.template for n in _notices(c) if is_dunning_template(n.template) and _after_settle(c, n)})
    if late:
        yield (HOLD_DUNNING_AFTER_RECOVERY,
               f"settled ({state}) at {_when(c.settled_at)}, yet dunning was requested afterwards: {', '.join(late)}")


# In the order the checks were written; blockers are sorted by `_ordered` in any case.
_CYCLE_CHECKS = (_explainability, _retry_eligibility, _attempt_budget, _grace_boundary, _entitlement_after_grace,
                 _override_authority, _dunning_after_recovery)


def _grace_is_over(c: CycleReview, state: str, now: datetime | None) -> bool:
    if state in POST_GRACE_STATES:
        return True
    if state == EXCEPTION_ACTIVE and c.suspended_state in POST_GRACE_STATES:
        return True
    if state in IN_GRACE_STATES or state == EXCEPTION_ACTIVE:
        return now is not None and c.grace_expires_at is not None and now >= c.grace_expires_at
    return False


def _exception_covers(c: CycleReview, state: str, now: datetime | None) -> bool:
    """Only a complete exception that has not run out, granting FULL, justifies FULL access."""
    if state != EXCEPTION_ACTIVE or now is None or c.exception_expires_at is None:
        return False
    complete = all(_text(v) for v in (c.exception_owner, c.exception_ticket, c.exception_reason))
    return complete and now < c.exception_expires_at and (c.exception_profile or FULL) == FULL


def _notices(c: CycleReview) -> list[Notice]:
    raw = c.notices
    if not isinstance(raw, Iterable) or isinstance(raw, str | bytes):
        return []
    return [n for n in raw if isinstance(n, Notice)]


def _after_settle(c: CycleReview, n: Notice) -> bool:
    """Ordered by receipt when both carry one (acceptance order), else by trusted time."""
    if _is_int(n.receipt_id) and _is_int(c.settled_receipt_id):
        return n.receipt_id > c.settled_receipt_id
    if n.requested_at is not None and c.settled_at is not None:
        return n.requested_at > c.settled_at
    return False


# --- helpers --------------------------------------------------------------------------------------

def _ordered(found: list[Blocker]) -> tuple[Blocker, ...]:
    unique = {(b.code, b.cycle_id or "", b.detail): b for b in found}
    return tuple(unique[k] for k in sorted(unique, key=lambda k: (_RANK.get(k[0], len(_RANK)), k[1], k[2])))


def _subscription_name(review: SubscriptionReview) -> str:
    ref = review.provider_subscription_id
    suffix = f" ({ref})" if isinstance(ref, str) and ref and ref != str(review.subscription_id) else ""
    return f"subscription {review.subscription_id}{suffix}"


def _cycle_id(c: Any) -> str | None:
    value = getattr(c, "cycle_id", None)
    return None if value is None else str(value)


def _name(c: Any) -> str:
    invoice = getattr(c, "invoice_ref", "")
    suffix = f" (invoice {invoice})" if isinstance(invoice, str) and invoice else ""
    return f"cycle {_cycle_id(c) or '(no id)'}{suffix}"


def _is_datetime(value: Any) -> bool:
    return isinstance(value, datetime)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _when(value: Any) -> str:
    return value.isoformat() if isinstance(value, datetime) else "none"


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + f" or {items[-1]}"


def _span(value: Any) -> str:
    if not isinstance(value, timedelta):
        return "an unknown length"
    if value == timedelta(0):
        return "zero length"
    sign = "minus " if value < timedelta(0) else ""
    seconds = abs(int(value.total_seconds()))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{n} {unit}{'s' if n != 1 else ''}"
             for n, unit in ((days, "day"), (hours, "hour"), (minutes, "minute"), (secs, "second")) if n]
    return sign + (" ".join(parts) or "under a second")
