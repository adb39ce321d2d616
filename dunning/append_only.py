"""Append-only models: rows are written once; only named bookkeeping fields may change later.

Money facts, provider receipts, transition receipts and raw provider events are evidence.
Rewriting or deleting them would make every later decision unexplainable, so the model layer
refuses it (instance save/delete and queryset update/delete alike).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from django.db import models


class AppendOnlyViolation(Exception):
    """Raised when code tries to rewrite or delete an append-only row."""


class AppendOnlyQuerySet(models.QuerySet):
    def update(self, **kwargs: Any) -> int:
        model = self.model
        allowed: frozenset[str] = getattr(model, "MUTABLE_FIELDS", frozenset())
        forbidden = set(kwargs) - allowed
        if forbidden:
            raise AppendOnlyViolation(
                f"{model.__name__} is append-only; cannot update {sorted(forbidden)}"
            )
        return super().update(**kwargs)

    def delete(self) -> tuple[int, dict[str, int]]:
        raise AppendOnlyViolation(f"{self.model.__name__} is append-only; rows are never deleted")

    def purge_raw_body(self, *, now: datetime) -> int:
        """The one exception to append-only (issue 19, retention of raw provider bodies): replace the
        model's raw body (`RAW_BODY_FIELD`) with its fixed purged form (`purged_raw_body()`) and stamp
        `body_purged_at`, once per row. The caller names no field and no value, so this opens no
        general update: a purge cannot write anything but the model's own empty body, and a purged
        row is not touched again. Every other column (digests, statuses, amounts, links) stays."""
        model = self.model
        field = getattr(model, "RAW_BODY_FIELD", "")
        if not field:
            raise AppendOnlyViolation(f"{model.__name__} has no raw body that may be purged")
        rows = self.filter(body_purged_at__isnull=True)
        return super(AppendOnlyQuerySet, rows).update(**{field: model.purged_raw_body(), "body_purged_at": now})


class AppendOnlyModel(models.Model):
    """Base for evidence tables. `MUTABLE_FIELDS` names processing fields that may change."""

    MUTABLE_FIELDS: ClassVar[frozenset[str]] = frozenset()

    objects = AppendOnlyQuerySet.as_manager()

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            update_fields = kwargs.get("update_fields")
            if update_fields is None or not set(update_fields) <= self.MUTABLE_FIELDS:
                raise AppendOnlyViolation(
                    f"{type(self).__name__} is append-only; an existing row may only change "
                    f"{sorted(self.MUTABLE_FIELDS) or 'nothing'} (pass update_fields)"
                )
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise AppendOnlyViolation(f"{type(self).__name__} is append-only; rows are never deleted")
