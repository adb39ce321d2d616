"""The "low-risk" criterion a policy states for a partial rollout (seed 001: "5 % of low-risk
subscriptions"). Pure Python: validated with the document, applied by dunning.policy.rollout.

    rollout:
      percent: 5
      low_risk:
        min_tenure_days: 90        # the subscription has existed this long
        max_amount_minor: 10000    # no invoice of it was ever larger (minor units)
        no_disputes: true          # no dispute fact on any of its invoices
        no_conflicts: true         # no cycle of it ever held an evidence conflict

Every field is optional; an absent block means every subscription in the bucket qualifies. The
block is written into the canonical document only when given, so older documents keep their digest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LOW_RISK_FIELDS = ("min_tenure_days", "max_amount_minor", "no_disputes", "no_conflicts")


@dataclass(frozen=True)
class LowRisk:
    min_tenure_days: int | None = None
    max_amount_minor: int | None = None
    no_disputes: bool = False
    no_conflicts: bool = False

    @classmethod
    def of(cls, block: dict[str, Any] | None) -> LowRisk | None:
        return cls(**{k: v for k, v in block.items() if k in LOW_RISK_FIELDS}) if block else None

    def describe(self) -> str:
        parts = []
        if self.min_tenure_days is not None:
            parts.append(f"tenure >= {self.min_tenure_days} days")
        if self.max_amount_minor is not None:
            parts.append(f"invoices <= {self.max_amount_minor} minor units")
        if self.no_disputes:
            parts.append("no disputes")
        if self.no_conflicts:
            parts.append("no evidence conflicts")
        return ", ".join(parts) or "everyone"


def check_low_risk(checker: Any, value: Any) -> dict[str, Any] | None:
    """Validate `rollout.low_risk` with the document's checker (one message per fault); the
    canonical block, or None when absent or at fault."""
    path = "rollout.low_risk"
    if value is None:
        return None
    if not isinstance(value, dict):
        checker.fault(path, f"must be a mapping of {', '.join(LOW_RISK_FIELDS)}; got {value!r}")
        return None
    for key in value:
        if key not in LOW_RISK_FIELDS:
            checker.fault(f"{path}.{key}", f"unknown field; expected {', '.join(LOW_RISK_FIELDS)}")
    block: dict[str, Any] = {}
    for key in ("min_tenure_days", "max_amount_minor"):
        if value.get(key) is not None:
            block[key] = checker.integer(f"{path}.{key}", value[key], 0, None, "a whole number, 0 or more")
    for key in ("no_disputes", "no_conflicts"):
        if value.get(key) is not None:
            block[key] = checker.boolean(f"{path}.{key}", value[key])
    if not block and not any(key not in LOW_RISK_FIELDS for key in value):
        checker.fault(path, "is empty; state at least one criterion or leave the block out")
    return block
