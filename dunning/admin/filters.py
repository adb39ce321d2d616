"""Changelist filters of the support console: cycle state, owner and age (SPEC §11).

Each filter builds one condition on cycles; on the subscription changelist it becomes an
EXISTS over the subscription's cycles, so rows are never duplicated and counts stay honest.
"""

from __future__ import annotations

import abc
from datetime import timedelta

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.db.models import Exists, OuterRef, Q, QuerySet

from dunning.clock import trusted_now
from dunning.models import DunningCycle
from dunning.models.inbox import EventReprocessing
from dunning.states import DELINQUENT_STATES, CycleState
from subscriptions.providers.labels import KNOWN_PROVIDERS, provider_label

OWNER_GROUPS = ("Support agents", "Billing leads")


class _CycleConditionFilter(admin.SimpleListFilter, metaclass=abc.ABCMeta):
    """Subclasses give `cycle_q(value, request)`; `on_subscriptions` wraps it in EXISTS."""

    on_subscriptions = False

    @abc.abstractmethod
    def cycle_q(self, value: str, request) -> Q:  # noqa: ANN001
        """The condition on DunningCycle rows for the chosen value."""

    def queryset(self, request, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if not value:
            return queryset
        condition = self.cycle_q(value, request)
        if self.on_subscriptions:
            return queryset.filter(Exists(DunningCycle.objects.filter(condition, subscription=OuterRef("pk"))))
        return queryset.filter(condition)


class CycleStateFilter(_CycleConditionFilter):
    title = "cycle state"
    parameter_name = "cycle_state"
    on_subscriptions = True

    def lookups(self, request, model_admin):
        return [("blocking", "any open debt"), *CycleState.choices]

    def cycle_q(self, value: str, request) -> Q:  # noqa: ANN001
        if value == "blocking":
            return Q(state__in=DELINQUENT_STATES)
        return Q(state=value)


class OwnerFilter(_CycleConditionFilter):
    """Who owns an unknown payment or an exception."""

    title = "owner"
    parameter_name = "owner"

    def lookups(self, request, model_admin):
        staff = (get_user_model().objects.filter(is_active=True, is_staff=True, groups__name__in=OWNER_GROUPS)
                 .distinct().order_by("username").values_list("pk", "username"))
        return [("mine", "mine"), ("unowned", "unknown payment without owner"),
                *[(str(pk), name) for pk, name in staff]]

    def cycle_q(self, value: str, request) -> Q:  # noqa: ANN001
        if value == "unowned":
            return Q(state=CycleState.PAYMENT_UNKNOWN, unknown_owner__isnull=True)
        if value == "mine":
            user = request.user
        else:
            user = get_user_model().objects.filter(pk=value).first() if value.isdigit() else None
            if user is None:
                return Q(pk__in=[])
        return Q(unknown_owner=user) | Q(exception_owner=user.get_username(), state=CycleState.EXCEPTION_ACTIVE)


class SubscriptionOwnerFilter(OwnerFilter):
    on_subscriptions = True


AGES = {
    "day": ("open under a day", None, timedelta(days=1)),
    "week": ("1–7 days", timedelta(days=1), timedelta(days=7)),
    "month": ("7–30 days", timedelta(days=7), timedelta(days=30)),
    "older": ("over 30 days", timedelta(days=30), None),
}


class _AgeFilter(admin.SimpleListFilter):
    title = "age of open debt"
    parameter_name = "age"
    field = "opened_at"

    def lookups(self, request, model_admin):
        return [(key, label) for key, (label, _, _) in AGES.items()]

    def queryset(self, request, queryset: QuerySet) -> QuerySet:
        if self.value() not in AGES:
            return queryset
        _, at_least, under = AGES[self.value()]
        now = trusted_now()
        conditions = {}
        if at_least is not None:
            conditions[f"{self.field}__lte"] = now - at_least
        if under is not None:
            conditions[f"{self.field}__gt"] = now - under
        return self.restrict(queryset).filter(**conditions)

    def restrict(self, queryset: QuerySet) -> QuerySet:
        return queryset


class CycleAgeFilter(_AgeFilter):
    def restrict(self, queryset: QuerySet) -> QuerySet:
        return queryset.filter(state__in=DELINQUENT_STATES)


class SubscriptionAgeFilter(_AgeFilter):
    """On the annotated `oldest_open` (the oldest cycle still in a delinquent state)."""

    field = "oldest_open"


HELD_OUTCOMES = ("QUARANTINED", "UNATTRIBUTABLE")


class HeldEventFilter(admin.SimpleListFilter):
    """Provider events that were held back (quarantined or unattributable), and those staff had
    fetched again."""

    title = "held"
    parameter_name = "held"

    def lookups(self, request, model_admin):
        return [("held", "held: quarantined or unattributable"),
                ("reprocessed", "re-processed by staff")]

    def queryset(self, request, queryset: QuerySet) -> QuerySet:
        if self.value() == "held":
            return queryset.filter(outcome__in=HELD_OUTCOMES)
        if self.value() == "reprocessed":
            return queryset.filter(Exists(EventReprocessing.objects.filter(event=OuterRef("pk"))))
        return queryset


class AlertStatusFilter(admin.SimpleListFilter):
    """Open alerts first: the list opens on them; "all" shows every episode."""

    title = "status"
    parameter_name = "status"
    default = "open"

    def lookups(self, request, model_admin):
        return [("open", "open"), ("unowned", "open, nobody owns it"), ("mine", "open, mine"),
                ("resolved", "resolved"), ("all", "all")]

    def value(self) -> str:
        return super().value() or self.default

    def choices(self, changelist):
        for lookup, title in self.lookup_choices:
            yield {"selected": self.value() == lookup, "display": title,
                   "query_string": changelist.get_query_string({self.parameter_name: lookup})}

    def queryset(self, request, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if value == "open":
            return queryset.filter(resolved_at__isnull=True)
        if value == "unowned":
            return queryset.filter(resolved_at__isnull=True, owner__isnull=True)
        if value == "mine":
            return queryset.filter(resolved_at__isnull=True, owner=request.user)
        if value == "resolved":
            return queryset.filter(resolved_at__isnull=False)
        return queryset


class ProviderFilter(admin.SimpleListFilter):
    """By payment provider ("Stripe", "Alipay"), labelled from subscriptions.providers.labels. The
    choices are the providers we know, not a DISTINCT over the table (no extra query per page);
    `field` is the lookup path to the provider name on the listed model."""

    title = "provider"
    parameter_name = "provider"
    field = "provider"

    def lookups(self, request, model_admin):
        return [(name, provider_label(name)) for name in KNOWN_PROVIDERS]

    def queryset(self, request, queryset: QuerySet) -> QuerySet:
        value = self.value()
        return queryset.filter(**{self.field: value}) if value else queryset


class InvoiceProviderFilter(ProviderFilter):
    field = "invoice__provider"
