"""Storing what a fresh provider fetch returned. Receipts are evidence whatever happens next,
so they are written before (and outside) the acceptance transaction that cites them."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from functools import cache
from typing import Any

from django.db import connection

from dunning.acceptance.row_inserts import insert_fields, insert_params, mark_saved
from dunning.clock import trusted_now
from dunning.models import ProviderEvent, ProviderReceipt
from dunning.privacy import desensitise
from subscriptions.models import Invoice


def body_digest(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def receipt_record(
    *,
    object_type: str,
    body: dict[str, Any],
    invoice: Invoice | None = None,
    account: str = "",
    fetched_at: datetime | None = None,
    cause_event: ProviderEvent | None = None,
    provider: str = "stripe",  # the adapter's name; an invoice's receipt is its invoice's provider's
) -> ProviderReceipt:
    amount = body.get("amount_due", body.get("amount"))
    receipt = ProviderReceipt(
        provider=invoice.provider if invoice is not None else provider, object_type=object_type,
        object_id=str(body["id"]), account=account,
        status=str(body.get("status", "")), amount=int(amount) if amount is not None else None,
        # The digest is of the body as fetched; only its desensitised form is stored (dunning.privacy).
        currency=str(body.get("currency", ""))[:3], body=desensitise(body), body_digest=body_digest(body),
        fetched_at=fetched_at or trusted_now(), invoice=invoice, cause_event=cause_event,
    )
    _insert(receipt)
    return receipt


@cache
def _insert_sql() -> str:
    qn = connection.ops.quote_name
    fields = insert_fields(ProviderReceipt)
    return (f"INSERT INTO {qn(ProviderReceipt._meta.db_table)} ({', '.join(qn(f.column) for f in fields)}) "
            f"VALUES ({', '.join(['%s'] * len(fields))}) RETURNING {qn('id')}")


def _insert(receipt: ProviderReceipt) -> None:
    """The row Django's `save()` would insert, by hand on PostgreSQL: a receipt is written on every
    fresh fetch (each grace sweep cycle, each paid event), and Django's save machinery was most of
    that write's CPU. No signal listens to receipts and they keep no history. SQLite saves."""
    if connection.vendor != "postgresql":
        receipt.save(force_insert=True)
        return
    with connection.cursor() as cursor:
        cursor.execute(_insert_sql(), insert_params(connection, receipt))
        (pk,) = cursor.fetchone()
    mark_saved(connection, receipt, pk)
