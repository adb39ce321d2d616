"""What processing one inbox event found: its outcome, notes, and the rows it was attributed to.
Shared by dunning.evidence.processing and the handlers it dispatches to (payment_methods)."""

from __future__ import annotations

from dataclasses import dataclass, field

from dunning.models import DunningCycle, EventOutcome
from subscriptions.models import Invoice, Subscription


@dataclass
class Processing:
    outcome: str = EventOutcome.NO_CHANGE
    detail: list[str] = field(default_factory=list)
    subscription: Subscription | None = None
    invoice: Invoice | None = None
    cycle: DunningCycle | None = None

    def finish(self, outcome: str, note: str = "") -> Processing:
        self.outcome = outcome
        if note:
            self.detail.append(note)
        return self
