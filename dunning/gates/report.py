"""Report types and shared helpers of the release gates: Gate, GatesReport, offender lists, paging."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from dunning.models import DunningPolicy
from dunning.policy.cache import policy_spec
from dunning.policy.document import PolicyDocument
from dunning.policy.rollout import StageMemo

from .definitions import BATCH, DETAIL_LIMIT, GATE_DEFINITIONS


@dataclass(frozen=True)
class Gate:
    key: str
    name: str
    figure: float | int | None
    display: str
    unit: str  # "%", "count" or "s"
    threshold: str
    passed: bool
    detail: tuple[str, ...]
    sample_size: int
    offending: int = 0
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["detail"] = list(self.detail)
        data["definition"] = GATE_DEFINITIONS.get(self.key, "")
        return data


@dataclass(frozen=True)
class GatesReport:
    evaluated_at: datetime
    gates: tuple[Gate, ...]

    @property
    def passed(self) -> bool:
        return all(g.passed for g in self.gates)

    @property
    def failed(self) -> list[Gate]:
        return [g for g in self.gates if not g.passed]

    def gate(self, key: str) -> Gate:
        return next(g for g in self.gates if g.key == key)

    def as_dict(self) -> dict[str, Any]:
        return {
            "evaluated_at": self.evaluated_at.isoformat(),
            "passed": self.passed,
            "failed": [g.key for g in self.failed],
            "gates": [g.as_dict() for g in self.gates],
        }


@dataclass
class _Offenders:
    """Counts offences and keeps the first few ids (deduplicated) for the report."""

    count: int = 0
    ids: list[str] = field(default_factory=list)

    def add(self, ident: Any, why: str = "") -> None:
        self.count += 1
        text = f"{ident} ({why})" if why else str(ident)
        if len(self.ids) < DETAIL_LIMIT and text not in self.ids:
            self.ids.append(text)

    def extend(self, count: int, idents: Iterable[Any], why: str = "") -> None:
        """Add `count` offences of which `idents` are the first few."""
        listed = 0
        for ident in idents:
            self.add(ident, why)
            listed += 1
        self.count += max(count - listed, 0)


# --- formatting helpers ---


def _rate_gate(key: str, name: str, ok: int, n: int, offenders: _Offenders, note: str = "") -> Gate:
    if n == 0:
        pct, display = 100.0, "100.00 % (n=0)"
    else:
        pct = 100.0 * ok / n
        shown = math.floor(pct * 100) / 100  # never round 99.996 up to a passing-looking 100.00
        display = f"{shown:.2f} % ({ok}/{n})"
    return Gate(key=key, name=name, figure=round(pct, 4), display=display, unit="%", threshold="= 100 %",
                passed=ok == n, detail=tuple(offenders.ids), sample_size=n, offending=n - ok, note=note)


def _count_gate(key: str, name: str, offenders: _Offenders, n: int, note: str = "") -> Gate:
    return Gate(key=key, name=name, figure=offenders.count, display=f"{offenders.count} (of {n} checked)",
                unit="count", threshold="= 0", passed=offenders.count == 0, detail=tuple(offenders.ids),
                sample_size=n, offending=offenders.count, note=note)


class _PolicySpecs:
    """Validated policy documents by id (published policies never change; there are few)."""

    def __init__(self) -> None:
        self._specs: dict[int, PolicyDocument] = {}
        # The rollout stage in force, read once per (policy, cohort) for the whole evaluation.
        self.stage = StageMemo()

    def __getitem__(self, policy_id: int) -> PolicyDocument:
        if policy_id not in self._specs:
            self._specs[policy_id] = policy_spec(DunningPolicy.objects.get(pk=policy_id))
        return self._specs[policy_id]


def _keyset(queryset, fields: tuple[str, ...], size: int = BATCH) -> Iterator[list[dict[str, Any]]]:
    """Pages of `fields` (plus pk) in pk order, each page one bounded query."""
    last = None
    while True:
        page = queryset.order_by("pk")
        if last is not None:
            page = page.filter(pk__gt=last)
        rows = list(page.values("pk", *fields)[:size])
        if not rows:
            return
        yield rows
        last = rows[-1]["pk"]
