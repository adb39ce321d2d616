"""dunning.history_descriptor: a model's history manager class is built once, not per access, and
each access still gets a manager bound to its own instance."""

from __future__ import annotations

from simple_history.manager import HistoricalQuerySet, HistoryManager

from subscriptions.models import Invoice
from tests.support.builders import make_subscription, open_cycle


def test_the_history_manager_class_is_built_once_per_model():
    first, second = Invoice.history, Invoice.history
    assert first is not second
    assert type(first) is type(second)  # before: a new class (type() + getmembers) on every access
    assert isinstance(first, HistoryManager) and issubclass(first._queryset_class, HistoricalQuerySet)
    assert first.model is Invoice.history.model and first.instance is None


def test_each_access_is_still_bound_to_its_own_instance(policy):
    one = open_cycle(make_subscription()).invoice
    two = open_cycle(make_subscription()).invoice
    assert one.history.instance is one and two.history.instance is two
    assert set(one.history.values_list("id", flat=True)) == {one.pk}
    assert set(two.history.values_list("id", flat=True)) == {two.pk}
