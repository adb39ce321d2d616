"""Marks code running inside the acceptance service.

Cycle FSM transitions carry a condition that this scope is open, so calling a transition
from a view, an admin action or a shell raises TransitionNotAllowed instead of quietly
changing monetary or access state.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_inside_acceptance: ContextVar[bool] = ContextVar("inside_acceptance", default=False)


def is_inside_acceptance(_instance: object = None) -> bool:
    return _inside_acceptance.get()


@contextmanager
def acceptance_scope() -> Iterator[None]:
    token = _inside_acceptance.set(True)
    try:
        yield
    finally:
        _inside_acceptance.reset(token)
