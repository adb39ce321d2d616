"""What the auditor and the reconciliation check read of a running simulation.

The engine's `Simulation` is one; they depend on this protocol rather than on the engine, which
imports them."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Protocol

from tests.verification.fake_stripe.core import SimulatorCore


class SimulatedWorld(Protocol):
    sim: SimulatorCore  # the provider's truth: its ledger, store and events
    subscriptions: list[str]  # the run's provider subscription ids, in creation order
    stale_invoices: set[str]  # invoices the product was shown an old copy of (a lagging read)
    event_watermark: int  # ProviderEvent pk before the run: older events are not the run's

    def now(self) -> datetime: ...

    def invoices(self, *statuses: str, plans: tuple[str, ...] = ()) -> list[dict[str, Any]]: ...

    def cycles(self, *states: str, plans: tuple[str, ...] = ()) -> list[Any]: ...

    def outage_overlaps(self, start: datetime, end: datetime) -> bool: ...

    def scheduler_due(self, when: datetime, period: timedelta) -> datetime: ...
