"""Storing what a fresh provider fetch returned. Receipts are evidence whatever happens next,
so they are written before (and outside) the acceptance transaction that cites them."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any

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
    return ProviderReceipt.objects.create(
        provider=invoice.provider if invoice is not None else provider, object_type=object_type,
        object_id=str(body["id"]), account=account,
        status=str(body.get("status", "")), amount=int(amount) if amount is not None else None,
        # The digest is of the body as fetched; only its desensitised form is stored (dunning.privacy).
        currency=str(body.get("currency", ""))[:3], body=desensitise(body), body_digest=body_digest(body),
        fetched_at=fetched_at or trusted_now(), invoice=invoice, cause_event=cause_event,
    )
