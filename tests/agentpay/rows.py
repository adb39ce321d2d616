"""An intent's rows as comparable values, for the tests that write the same intent twice (once as
the one-statement path on PostgreSQL, once through the ORM) and compare every column."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from django.db.models import Model

from agentpay.models import PaymentIntent


def row_values(obj: Model, intent: PaymentIntent, generated: Collection[str]) -> dict[str, Any]:
    """Every column but the `generated` ones (ids that differ between two runs by nature)."""
    values = {f.name: getattr(obj, f.attname) for f in obj._meta.concrete_fields if f.name not in generated}
    # The intent's public id is in the outbox row's dedupe key and payload: the same row, another id.
    return {k: (str(v).replace(intent.intent_id, "pi_*") if k in ("dedupe_key", "payload") else v)
            for k, v in values.items()}


def intent_rows(intent: PaymentIntent, models: Sequence[type[Model]],
                generated: Collection[str]) -> dict[str, list[dict[str, Any]]]:
    """The intent's row as stored and its rows of each of `models`, in id order."""
    intent = PaymentIntent.objects.get(pk=intent.pk)
    rows = {"intent": [row_values(intent, intent, generated)]}
    for model in models:
        rows[model.__name__] = [row_values(obj, intent, generated)
                                for obj in model.objects.filter(intent=intent).order_by("pk")]
    return rows
