from __future__ import annotations

from typing import Any

# The lead-only permission that pauses restrictions also governs the rollout: both change how
# the product enforces, and reusing it needs no new permission migration.
ROLLOUT_PERMISSION = "dunning.incident_switch"


class RolloutError(ValueError):
    """A rollout request refused before anything changed; `code` is stable, the message says why."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(f"{code}: {message}")


def require_lead(user: Any, reason: str, ticket: str) -> None:
    if not (reason or "").strip() or not (ticket or "").strip():
        raise RolloutError("REASON_AND_TICKET_REQUIRED", "a rollout decision needs a reason and a ticket reference")
    if user is None or not user.has_perm(ROLLOUT_PERMISSION):
        raise RolloutError("NOT_A_BILLING_LEAD", "only a billing lead may change a rollout")
