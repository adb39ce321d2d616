"""One manager class per history descriptor, not one per access.

django-simple-history's `HistoryDescriptor.__get__` builds a new manager class on every access
(`HistoryManager.from_queryset(HistoricalQuerySet)`: `type()` plus Django's `inspect.getmembers`
walk of the queryset's methods), and every history row written reads the descriptor once
(`create_historical_record` -> `getattr(instance, "history")`). On the paid path that class
building was about 4 % of a paid event's CPU (the invoice mirror's history row). The class depends
only on the descriptor's two classes, so it is built once per descriptor and kept; each access
still gets its own manager bound to the model and instance, as before.
"""

from __future__ import annotations

from typing import Any

from simple_history.manager import HistoryDescriptor


def _get(self: HistoryDescriptor, instance: Any, owner: type) -> Any:
    manager_class = self.__dict__.get("_manager_class")
    if manager_class is None:  # two threads may both build it; either result is the same class
        manager_class = self._manager_class = self.manager_class.from_queryset(self.queryset_class)
    return manager_class(self.model, instance)


def cache_history_manager_classes() -> None:
    """Idempotent; DunningConfig.ready calls it."""
    HistoryDescriptor.__get__ = _get
