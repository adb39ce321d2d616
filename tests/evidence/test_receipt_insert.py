"""`receipt_record` (dunning.evidence.receipts) writes its receipt by hand on PostgreSQL: the row
Django's own save writes (the embedded SQLite demo's path), one INSERT, the instance left saved."""

from __future__ import annotations

from typing import Any

from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from dunning.evidence.receipts import receipt_record
from dunning.models import ProviderReceipt
from tests.support.builders import make_subscription, open_cycle

BODY = {"id": "in_receipt_1", "object": "invoice", "status": "open", "amount_due": 2500, "currency": "usd",
        "customer_email": "ada@example.com", "lines": {"data": [{"price": {"id": "price_monthly_pro"}}]}}


def _row(receipt: ProviderReceipt) -> dict[str, Any]:
    stored = ProviderReceipt.objects.get(pk=receipt.pk)
    return {f.attname: getattr(stored, f.attname) for f in ProviderReceipt._meta.concrete_fields if f.attname != "id"}


def test_the_row_is_the_one_django_s_save_writes(policy, monkeypatch):
    invoice = open_cycle(make_subscription()).invoice
    at = timezone.now()
    with CaptureQueriesContext(connection) as queries:
        mine = receipt_record(object_type="invoice", body=BODY, invoice=invoice, account="acct_demo", fetched_at=at)
    [insert] = queries.captured_queries
    assert insert["sql"].startswith('INSERT INTO "dunning_providerreceipt"')
    assert mine.pk is not None and not mine._state.adding and mine._state.db == "default"
    monkeypatch.setattr(connections["default"], "vendor", "sqlite")  # the demo's path: Django's save
    theirs = receipt_record(object_type="invoice", body=BODY, invoice=invoice, account="acct_demo", fetched_at=at)
    monkeypatch.undo()
    assert theirs.pk == mine.pk + 1
    assert _row(mine) == _row(theirs)
    assert _row(mine)["body_digest"] and _row(mine)["fetched_at"] == at
