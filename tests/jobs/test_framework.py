"""Keyset paging of due rows (dunning.jobs.framework.due_in_order / due_page)."""

from datetime import UTC, datetime, timedelta

import pytest

from dunning.jobs.framework import due_in_order, due_page
from dunning.models.inbox import WebhookDelivery

T0 = datetime(2026, 3, 1, tzinfo=UTC)


def _deliveries(offsets_minutes: list[int]) -> list[WebhookDelivery]:
    return [WebhookDelivery.objects.create(received_at=T0 + timedelta(minutes=m), body=b"{}", body_size=2)
            for m in offsets_minutes]


@pytest.mark.django_db
def test_pages_cut_through_equal_due_times_yield_each_row_once_in_due_order():
    # Three rows share each due time, and a page of 2 ends in the middle of every group.
    rows = _deliveries([5, 1, 3, 1, 5, 3, 1, 3, 5])
    expected = [d.pk for d in sorted(rows, key=lambda d: (d.received_at, d.pk))]

    assert list(due_in_order(WebhookDelivery.objects.all(), "received_at", batch=2)) == expected


@pytest.mark.django_db
def test_a_later_page_is_bounded_below_by_the_last_due_time():
    """The `>=` bound is what an index on the due column can use; without it each page re-walks
    every row already swept (the bench's 100k sweep would grow quadratically)."""
    rows = _deliveries([1, 2, 2, 3])
    after = (rows[1].received_at, rows[1].pk)

    page = due_page(WebhookDelivery.objects.all(), "received_at", after, batch=10)

    assert [pk for _, pk in page] == [rows[2].pk, rows[3].pk]
    sql = str(page.query)
    assert '"received_at" >=' in sql, sql
