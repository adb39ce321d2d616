"""Who owns an unknown payment (SPEC §5: an owner within one hour).

A configured queue user when there is one (DUNNING_UNKNOWN_PAYMENT_QUEUE_USER), otherwise the
active members of the owner groups in turn: the one with the fewest unknown payments open,
then the one whose last assignment is oldest (never assigned first).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import Count, Max

from dunning.models import DunningCycle
from dunning.states import CycleState

OWNER_GROUPS_DEFAULT = ("Billing leads", "Support agents")


def unknown_owner_pick() -> Any | None:
    user_model = get_user_model()
    queue = getattr(settings, "DUNNING_UNKNOWN_PAYMENT_QUEUE_USER", "")
    if queue:
        return user_model.objects.filter(**{user_model.USERNAME_FIELD: queue}, is_active=True).first()
    groups = getattr(settings, "DUNNING_UNKNOWN_OWNER_GROUPS", OWNER_GROUPS_DEFAULT)
    users = list(user_model.objects.filter(is_active=True, groups__name__in=groups).distinct().order_by("pk"))
    if not users:
        return None
    assigned = DunningCycle.objects.filter(unknown_owner__in=users).values("unknown_owner")
    open_now = dict(assigned.filter(state=CycleState.PAYMENT_UNKNOWN).annotate(n=Count("pk"))
                    .values_list("unknown_owner", "n"))
    last = dict(assigned.annotate(at=Max("unknown_owner_assigned_at")).values_list("unknown_owner", "at"))
    never = datetime.min.replace(tzinfo=None)

    def turn(user: Any) -> tuple:
        at = last.get(user.pk)
        return (open_now.get(user.pk, 0), at is not None, at.replace(tzinfo=None) if at else never, user.pk)

    return min(users, key=turn)
