"""The adapter pages through the provider's event list (reconciliation checks every event of
its window against the inbox, not just the newest page)."""

from __future__ import annotations

from datetime import UTC, datetime

from subscriptions.providers.registry import get_provider
from tests.support.scenarios import subscribe


def test_all_events_since_a_point_are_listed_across_pages(sim):
    for _ in range(30):
        subscribe(sim)
    total = len(sim.store.events_by_id)
    assert total > 100, "more than one page"
    provider = get_provider()
    events = provider.list_events_since(created_after=datetime(2020, 1, 1, tzinfo=UTC))
    assert sorted(e["id"] for e in events) == sorted(sim.store.events_by_id)
    assert len(provider.list_events_since(created_after=datetime(2020, 1, 1, tzinfo=UTC), max_events=50)) == 50
