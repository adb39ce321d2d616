"""Actors: users, staff members in the roles the migrations make, customers with a billing
login, and API clients logged in as them or holding a service token.

Plain functions; the area conftests wrap the ones they need in fixtures (a fixture's name and
the actor it makes stay next to the tests that use them)."""

from __future__ import annotations

from collections.abc import Iterable
from importlib import import_module
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from rest_framework.test import APIClient

PASSWORD = "x"
AGENTS = "Support agents"
LEADS = "Billing leads"

ROLE_MIGRATIONS = (
    ("dunning.migrations.0006_staff_groups", "create_groups"),
    ("dunning.migrations.0007_support_console_permissions", "grant"),
    ("dunning.migrations.0010_event_reprocessing_and_alert_handling", "grant"),
    ("agentpay.migrations.0002_append_only_triggers_and_lead_permissions", "grant"),
    ("agentpay.migrations.0005_review_queue_and_admin_grants", "grant"),
    ("agentpay.migrations.0006_fulfillment_status_queries", "grant"),
    ("agentpay.migrations.0008_tenant_webhooks", "grant"),
    ("agentpay.migrations.0011_tenant_customer_links", "grant"),
    ("agentpay.migrations.0012_onchain_admin_grants", "grant"),
    ("entitlements.migrations.0003_api_role_permissions", "grant"),
    ("subscriptions.migrations.0004_usage_records", "grant"),
    ("subscriptions.migrations.0006_alipay_view_permissions", "grant"),
)


def make_user(username: str, *, password: str | None = PASSWORD, staff: bool = False, **fields: Any) -> Any:
    """A user (`password=None`: one that cannot log in with a password)."""
    return get_user_model().objects.create_user(username, password=password, is_staff=staff, **fields)


def make_staff(username: str, *groups: str, password: str | None = PASSWORD, **fields: Any) -> Any:
    """A staff member in the named groups, which must exist already (the role migrations make them)."""
    user = make_user(username, password=password, staff=True, **fields)
    for name in groups:
        user.groups.add(Group.objects.get(name=name))
    return user


def role(name: str, *, app_label: str = "", codenames: Iterable[str] = ()) -> Group:
    """The group, made again if a flushed (transactional) database lost it, with these grants added."""
    group, _ = Group.objects.get_or_create(name=name)
    codenames = list(codenames)
    if codenames:
        group.permissions.add(*Permission.objects.filter(content_type__app_label=app_label, codename__in=codenames))
    return group


def perms_of(group: str) -> set[str]:
    """The group's permissions as `app_label.codename`."""
    return {f"{p.content_type.app_label}.{p.codename}"
            for p in Group.objects.get(name=group).permissions.select_related("content_type")}


def staff_roles_from_migration() -> None:
    """Re-apply the role migrations' own code: a transactional (live-server) test starts from a
    flushed database, which keeps permissions but not the groups the migrations made."""
    from django.apps import apps

    for module, function in ROLE_MIGRATIONS:
        getattr(import_module(module), function)(apps, None)


def customer_login(subscription: Any, username: str, *, password: str = PASSWORD) -> Any:
    """A login linked to the subscription's customer (the customer billing pages' user)."""
    user = make_user(username, password=password)
    customer = subscription.customer
    customer.user = user  # Customer is not a protected model: linking a login is plain data entry
    customer.save(update_fields=["user"])
    return user


def session_client(user: Any) -> APIClient:
    """An API client logged in (session) as the user."""
    client = APIClient()
    client.force_login(user)
    return client


def bearer_client(raw_token: str) -> APIClient:
    """An API client sending the service token as a Bearer credential."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_token}")
    return client
