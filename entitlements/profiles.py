"""Entitlement profiles (SPEC §7): access is a set of stated capabilities, never one boolean.

Export stays available in every profile but REVOKED, and even there existing data remains
exportable through support. Safety and legal obligations (security notices, data-subject
requests) never switch off for delinquency, so every profile states them as kept.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

FULL = "FULL"
LIMITED = "LIMITED"
READ_EXPORT_NO_NEW_JOBS = "READ_EXPORT_NO_NEW_JOBS"
SUSPENDED = "SUSPENDED"
REVOKED = "REVOKED"


@dataclass(frozen=True)
class Profile:
    name: str
    rank: int  # higher is more restrictive
    read: bool
    write: bool
    export: bool
    api_tokens: str  # "read_write" | "read_only" | "none"
    background_jobs: str  # "start_and_run" | "existing_only" | "none"
    excess_resources: bool
    limits: dict[str, Any] = field(default_factory=dict)
    export_via_support: bool = True
    safety_and_legal_obligations: bool = True
    summary: str = ""

    def __post_init__(self) -> None:
        # The frozen profile's capabilities, read once: `asdict` deep-copies every field, and it
        # ran twice per entitlement change (the snapshot and its outbox message).
        stated = asdict(self)
        for key in ("name", "rank", "summary"):
            stated.pop(key)
        object.__setattr__(self, "_stated", stated)

    def capabilities(self) -> dict[str, Any]:
        """The stated capabilities, a new dict each call. Only `limits` is a container (its values
        plain JSON scalars), so copying it keeps every caller's dict apart from the profile's."""
        stated = self._stated
        return {**stated, "limits": dict(stated["limits"])}


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(FULL, 0, True, True, True, "read_write", "start_and_run", True,
                summary="full access"),
        Profile(LIMITED, 1, True, True, True, "read_write", "existing_only", False,
                limits={"new_background_jobs_per_day": 0, "excess_resources": "frozen at current usage"},
                summary="use continues with limits; no new heavy jobs or extra resources"),
        Profile(READ_EXPORT_NO_NEW_JOBS, 2, True, False, True, "read_only", "existing_only", False,
                summary="read and export only"),
        Profile(SUSPENDED, 3, True, False, True, "none", "none", False,
                summary="suspended: you can still sign in to read and export your data"),
        Profile(REVOKED, 4, False, False, False, "none", "none", False,
                summary="access ended; support can still export your existing data"),
    )
}


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown entitlement profile {name!r}; known: {', '.join(PROFILES)}") from None


def most_restrictive(names: Iterable[str]) -> str | None:
    ranked = [get_profile(n) for n in names]
    if not ranked:
        return None
    return max(ranked, key=lambda p: p.rank).name
