"""Which of two policy documents is the more permissive (seed 001: "revert to the more permissive
previous policy"). Pure Python.

A document is compared on three axes, each "more is kinder to the customer":
- grace: its duration (a NO_GRACE policy has none);
- restricted profile: lower in ``PROFILES`` (FULL … REVOKED) restricts less;
- cancellation: MANUAL_ONLY never cancels on a timer; otherwise the longer
  ``cancel_after_restricted`` cancels later.
A rollback target must be at least as permissive as the current policy on *every* axis, so a
rollback never tightens anything; among those, the most permissive wins (axes in the order above),
then the newest version.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import TypeVar

from dunning.policy.document import PROFILES, PolicyDocument, format_iso_duration

NEVER = timedelta.max
T = TypeVar("T")


def permissiveness(spec: PolicyDocument) -> tuple[timedelta, int, timedelta]:
    grace = spec.grace_duration if spec.has_grace else timedelta(0)
    looseness = len(PROFILES) - PROFILES.index(spec.restricted_profile)
    cancel = NEVER if spec.cancel_after == "MANUAL_ONLY" else (spec.cancel_after_restricted or timedelta(0))
    return grace, looseness, cancel


def at_least_as_permissive(candidate: PolicyDocument, current: PolicyDocument) -> bool:
    return all(c >= p for c, p in zip(permissiveness(candidate), permissiveness(current), strict=True))


def describe(spec: PolicyDocument) -> str:
    grace = f"grace {format_iso_duration(spec.grace_duration)}" if spec.has_grace else "no grace"
    cancel = ("manual cancellation only" if spec.cancel_after == "MANUAL_ONLY" or not spec.cancel_after_restricted
              else f"cancels {format_iso_duration(spec.cancel_after_restricted)} after restriction")
    return f"{spec.identity}: {grace}, restricted {spec.restricted_profile}, {cancel}"


def most_permissive_not_stricter(current: PolicyDocument, candidates: Iterable[tuple[PolicyDocument, T]]
                                 ) -> T | None:
    """The item of the most permissive candidate no stricter than `current` on any axis, else None."""
    eligible = [(spec, item) for spec, item in candidates if at_least_as_permissive(spec, current)]
    if not eligible:
        return None
    return max(eligible, key=lambda pair: (permissiveness(pair[0]), pair[0].version))[1]
