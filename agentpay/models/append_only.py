"""Append-only rows: written once; only named bookkeeping fields may change.

Ledger transfers, receipts and the gateway's request log are evidence. The model layer refuses
rewrites (instance and queryset alike) and, on PostgreSQL, a trigger refuses them in the
database too (migration 0002), so not even a raw UPDATE changes a posted transfer. Kept in
agentpay rather than imported from dunning, which is about to move.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import models


class AppendOnlyViolation(Exception):
    """Code tried to rewrite or delete an append-only row."""


class AppendOnlyQuerySet(models.QuerySet):
    def update(self, **kwargs: Any) -> int:
        allowed: frozenset[str] = getattr(self.model, "MUTABLE_FIELDS", frozenset())
        forbidden = set(kwargs) - allowed
        if forbidden:
            raise AppendOnlyViolation(f"{self.model.__name__} is append-only; cannot update {sorted(forbidden)}")
        return super().update(**kwargs)

    def delete(self) -> tuple[int, dict[str, int]]:
        raise AppendOnlyViolation(f"{self.model.__name__} is append-only; rows are never deleted")


class AppendOnlyModel(models.Model):
    MUTABLE_FIELDS: ClassVar[frozenset[str]] = frozenset()

    objects = AppendOnlyQuerySet.as_manager()

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            update_fields = kwargs.get("update_fields")
            if update_fields is None or not set(update_fields) <= self.MUTABLE_FIELDS:
                raise AppendOnlyViolation(f"{type(self).__name__} is append-only; an existing row may only change "
                                          f"{sorted(self.MUTABLE_FIELDS) or 'nothing'}")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise AppendOnlyViolation(f"{type(self).__name__} is append-only; rows are never deleted")
