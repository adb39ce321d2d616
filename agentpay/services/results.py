"""What goes into the acceptance service and what comes out of it."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from agentpay.composite import display_status
from agentpay.states import GUARD_FAILED, LINES, Lines, guard_of, refusal_class


@dataclass(frozen=True)
class Step:
    """One event on one line: what a vector, the gateway, a job or a person asks for."""

    line: str
    event: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RequestAnswer:
    """The answer a gateway request's row (GatewayRequest, written already) takes in the statement
    of the acceptance that decides it, so no UPDATE of the row follows (agentpay.api.request_log)."""

    request_id: uuid.UUID
    status: int
    problem: str
    answered_at: datetime
    duration_ms: int


@dataclass(frozen=True)
class Cause:
    """Who asks. Every receipt names it."""

    kind: str  # CauseKind
    actor: str
    user: Any = None
    request_id: uuid.UUID | None = None
    reason: str = ""
    ticket: str = ""

    @classmethod
    def request(cls, request_id: uuid.UUID, tenant_id: str) -> Cause:
        return cls("request", f"tenant:{tenant_id}", request_id=request_id)

    @classmethod
    def job(cls, name: str) -> Cause:
        return cls("job", f"job:{name}")

    @classmethod
    def person(cls, user: Any, *, reason: str, ticket: str) -> Cause:
        return cls("user", f"user:{user.get_username()}", user=user, reason=reason, ticket=ticket)

    @classmethod
    def system(cls, what: str) -> Cause:
        return cls("system", f"system:{what}")


class Refusal(Exception):
    def __init__(self, code: str, detail: str = "", step: Step | None = None) -> None:
        super().__init__(f"{code}: {detail}")
        self.code, self.detail, self.step = code, detail, step


@dataclass(frozen=True)
class Outcome:
    accepted: bool
    intent_id: str
    lines: Lines
    generation: int
    refusal_code: str = ""
    detail: str = ""
    refused_step: Step | None = None
    receipt_ids: tuple[int, ...] = ()
    request_answered: bool = False  # the gateway request's row took the answer asked with the steps

    @property
    def refusal(self) -> str:
        """The conformance file's refusal class: terminal_state, rail_mismatch, no_transition,
        guard_failed ('' when accepted)."""
        return "" if self.accepted else refusal_class(self.refusal_code)

    @property
    def guard(self) -> str:
        """The name of the guard that failed (only for guard_failed)."""
        if self.refusal != GUARD_FAILED or self.refused_step is None:
            return ""
        step = self.refused_step
        return guard_of(step.line, self.lines.state(step.line), step.event) if step.line in LINES else ""

    @property
    def display_status(self) -> str:
        return display_status(self.lines)
