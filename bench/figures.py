"""The arithmetic of the realistic-provider figures (issue 21), pure so it can be tested without
services: the rate-limit floor and the ratio to it, the provider requests a run needed, the
claims verdict of a concurrent sweep against the sequential one, the drain rate of a burst and
the points of a cumulative distribution."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


def requests_needed(stats: Mapping[str, Any], kind: str = "read") -> int | None:
    """Requests the provider executed (seen minus those it answered 429: a 429 executes nothing),
    from the simulator's counters (GET /_sim/realism); None when the counters are missing."""
    if kind not in stats:
        return None
    return int(stats[kind]) - int(stats.get(f"rate_limited_{kind}", 0))


def rate_limit_floor(requests: int, rate: float) -> float:
    """The least wall time `requests` can take at `rate` requests a second: the physical bound."""
    if rate <= 0:
        raise ValueError("the rate limit must be positive")
    return requests / rate


def ratio_to_floor(wall_seconds: float, floor_seconds: float) -> float | None:
    return wall_seconds / floor_seconds if floor_seconds > 0 else None


@dataclass(frozen=True)
class ClaimsVerdict:
    """A sweep's acceptances against the sequential path's.

    `patterns` maps each cycle's accepted edges (sorted, comma-joined) to how many cycles had
    exactly them; the sequential reference must show one pattern, and the concurrent run every
    cycle with that same pattern: no edge accepted twice, none missing, no refusal."""

    cycles: int
    restricted: int
    duplicates: int
    refused: int
    patterns: dict[str, int]
    reference: dict[str, int]

    @property
    def same_as_sequential(self) -> bool:
        return (len(self.reference) == 1 and self.patterns == {next(iter(self.reference)): self.cycles}
                and self.restricted == self.cycles and self.duplicates == 0 and self.refused == 0)

    def as_dict(self) -> dict[str, Any]:
        return {"cycles": self.cycles, "restricted": self.restricted, "duplicates": self.duplicates,
                "refused": self.refused, "patterns": self.patterns, "reference": self.reference,
                "same_as_sequential": self.same_as_sequential}


def drain_rate(restored: int, first_send: float, last_done: float) -> float | None:
    """Restorations a second over the whole burst, from its first send to its last FULL snapshot."""
    span = last_done - first_send
    return restored / span if restored and span > 0 else None


def ceiling_per_s(rate_limit: float, requests_per_event: float | None) -> float:
    """What the provider's limit allows: events a second when each needs `requests_per_event` reads."""
    return rate_limit / requests_per_event if requests_per_event else rate_limit


def cdf_points(values: Sequence[float]) -> tuple[list[float], list[float]]:
    """(sorted values, fraction of values at or below each)."""
    ordered = sorted(values)
    n = len(ordered)
    return ordered, [(i + 1) / n for i in range(n)]


def floor_line(cycles: int, floor_seconds: float, factor: float = 1.0) -> tuple[list[float], list[float]]:
    """The progress a sweep running exactly at `factor` × the rate-limit floor would show."""
    return [0.0, floor_seconds * factor], [0.0, float(cycles)]
