"""What a hand-written INSERT of a model instance needs from Django, shared by the one-statement
writers (dunning.acceptance.settlement_writes, agentpay.services.open_writes through agentpay.bridge):
the instance built as Django builds it (without its per-field walk), the values Django's own INSERT
would send, and the instance marked saved afterwards."""

from __future__ import annotations

from functools import cache
from typing import Any, TypeVar

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field, Model
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init

M = TypeVar("M", bound=Model)


@cache
def _blank(model: type[Model]) -> tuple[dict[str, Any], tuple[Field, ...], dict[str, Field]]:
    """(each concrete field's attname -> its constant default, the fields whose default is called,
    the fields by name and by attname)."""
    constant, called, named = {}, [], {}
    for field in model._meta.concrete_fields:
        named[field.name] = named[field.attname] = field
        if field.has_default() and callable(field.default):
            called.append(field)
        else:
            constant[field.attname] = field.get_default()  # the object Django's __init__ sets, shared as there
    return constant, tuple(called), named


def unsaved_row(model: type[M], **values: Any) -> M:
    """`model(**values)`, as Django's __init__ leaves it, for a row a hand-written INSERT writes.

    Django's __init__ walks every field through its descriptor and sends pre_init/post_init: a
    wallet call builds about twenty rows, and that walk was the largest Python item of its
    service time left. Here the defaults are copied in at once; a value given by a field's
    attname is set as it is, a related object through its descriptor (as __init__ does, which
    sets the id and caches the object). A model with pre_init/post_init receivers, or a name
    that is not a concrete field's (a property), takes Django's own __init__
    (tests/test_row_inserts.py compares both)."""
    constant, called, named = _blank(model)
    if pre_init.has_listeners(model) or post_init.has_listeners(model):
        return model(**values)
    obj = model.__new__(model)
    obj._state = ModelState()
    state = obj.__dict__
    state.update(constant)
    for field in called:
        if field.attname not in values and field.name not in values:
            state[field.attname] = field.get_default()
    for name, value in values.items():
        field = named.get(name)
        if field is None:
            return model(**values)
        if name == field.attname:
            state[name] = value
        else:  # a related object: its id and the cached object, through the descriptor
            setattr(obj, name, value)
    return obj


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
