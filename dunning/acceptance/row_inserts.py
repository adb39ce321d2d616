"""What a hand-written INSERT of a model instance needs from Django, shared by the one-statement
writers (dunning.acceptance.settlement_writes, agentpay.services.open_writes through agentpay.bridge):
the values Django's own INSERT would send, and the instance marked saved afterwards."""

from __future__ import annotations

from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field, Model


def mark_saved(db: BaseDatabaseWrapper, obj: Model, pk: int) -> None:
    """The instance as Django leaves it after its own INSERT returned `pk`."""
    obj.pk = pk
    obj._state.adding = False
    obj._state.db = db.alias


def insert_fields(model: type[Model], but: str = "") -> list[Field]:
    return [f for f in model._meta.local_concrete_fields if not f.primary_key and f.name != but]


def insert_params(db: BaseDatabaseWrapper, obj: Model, but: str = "") -> list[Any]:
    """The values Django's own INSERT of `obj` would send (defaults and `auto_now_add` applied,
    each field's conversion), without the primary key and the field named `but`."""
    return [f.get_db_prep_save(f.pre_save(obj, True), db) for f in insert_fields(type(obj), but)]
