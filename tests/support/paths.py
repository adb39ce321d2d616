"""Walks a cycle to any state of SPEC §5 through accepted edges only."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from dunning.acceptance.inputs import Cause
from tests.support.builders import accept, paid_evidence, reload, unpaid_evidence

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


class Walker:
    """Drives one cycle with an explicit clock; every step must be accepted."""

    def __init__(self, cycle: Any, *, staff: Any = None, now: datetime | None = None) -> None:
        self.cycle = cycle
        self.staff = staff
        self.now = now or T0

    def step(self, edge: str, **kwargs: Any) -> Any:
        result = accept(self.cycle, edge, now=self.now, **kwargs)
        assert result.accepted, f"{edge} refused: {result.reason} {result.detail}"
        self.cycle = reload(self.cycle)
        return result

    def advance(self, delta: timedelta) -> None:
        self.now += delta

    def staff_cause(self, reason: str = "customer called", ticket: str = "SUP-1") -> Cause:
        return Cause.staff(self.staff, reason=reason, ticket=ticket)

    # --- paths ---
    def to_payment_failed(self, decline_code: str = "insufficient_funds") -> Walker:
        self.step("record_failure", decline_code=decline_code)
        return self

    def to_grace(self, decline_code: str = "insufficient_funds") -> Walker:
        self.to_payment_failed(decline_code)
        self.step("start_grace")
        return self

    def to_retry_scheduled(self) -> Walker:
        self.to_grace()
        self.step("schedule_retry", next_attempt_at=self.now + timedelta(days=1))
        return self

    def to_dispatching(self) -> Walker:
        """Needs a LOCAL policy."""
        self.to_grace()
        self.step("schedule_retry")
        self.step("prepare_retry")
        self.step("dispatch_retry")
        return self

    def to_unknown(self) -> Walker:
        self.to_dispatching()
        self.step("mark_unknown")
        return self

    def to_retry_failed(self) -> Walker:
        self.to_retry_scheduled()
        self.step("retry_failed", decline_code="insufficient_funds", attempt_number=2)
        return self

    def to_grace_expired(self) -> Walker:
        self.to_grace()
        self.now = self.cycle.grace_expires_at + timedelta(seconds=1)
        self.step("expire_grace")
        return self

    def to_restricting(self) -> Walker:
        self.to_grace_expired()
        self.step("begin_restriction", evidence=unpaid_evidence(self.cycle, now=self.now))
        return self

    def to_restricted(self) -> Walker:
        self.to_restricting()
        self.step("complete_restriction")
        return self

    def to_cancel_pending(self) -> Walker:
        self.to_restricted()
        self.advance(timedelta(days=30, seconds=1))
        self.step("request_cancellation")
        return self

    def to_canceled(self) -> Walker:
        self.to_cancel_pending()
        self.step("cancel", evidence=unpaid_evidence(self.cycle, now=self.now))
        return self

    def to_recovered(self) -> Walker:
        self.to_grace()
        self.step("recover", evidence=paid_evidence(self.cycle, now=self.now))
        return self

    def to_closed_void(self) -> Walker:
        self.to_grace()
        self.step("close_void", evidence=unpaid_evidence(self.cycle, now=self.now, status="void"))
        return self

    def to_conflict(self) -> Walker:
        self.to_grace()
        self.step("flag_conflict", conflict_reason="paid receipt and a later failure for the same attempt")
        return self

    def to_exception(self) -> Walker:
        self.to_restricted()
        self.step("grant_exception", cause=self.staff_cause(), expires_at=self.now + timedelta(days=3))
        return self

    def to_current(self) -> Walker:
        return self


PATH_TO = {
    "CURRENT": Walker.to_current,
    "PAYMENT_FAILED": Walker.to_payment_failed,
    "GRACE_ACTIVE": Walker.to_grace,
    "RETRY_SCHEDULED": Walker.to_retry_scheduled,
    "RETRY_DISPATCHING": Walker.to_dispatching,
    "RETRY_FAILED": Walker.to_retry_failed,
    "PAYMENT_UNKNOWN": Walker.to_unknown,
    "GRACE_EXPIRED": Walker.to_grace_expired,
    "RESTRICTING": Walker.to_restricting,
    "RESTRICTED": Walker.to_restricted,
    "CANCEL_PENDING": Walker.to_cancel_pending,
    "CANCELED": Walker.to_canceled,
    "RECOVERED": Walker.to_recovered,
    "CLOSED_VOID": Walker.to_closed_void,
    "EVIDENCE_CONFLICT": Walker.to_conflict,
    "EXCEPTION_ACTIVE": Walker.to_exception,
}
LOCAL_ONLY = {"RETRY_DISPATCHING", "PAYMENT_UNKNOWN"}
