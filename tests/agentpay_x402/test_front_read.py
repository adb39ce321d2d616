"""The gateway's front read (agentpay/api/front.py): the key, its tenant, the route and its
network in one statement on PostgreSQL, the same objects as the ORM's two queries; nothing
cached, so a revoked key or a changed route is seen by the next read."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.models import Model
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agentpay.api import front
from agentpay.api.auth import key_digest, tenant_api_key_create
from agentpay.models import PricedRoute, TenantApiKey
from tests.agentpay.conftest import routes  # noqa: F401

pytestmark = pytest.mark.django_db


def _values(obj: Model | None) -> dict | None:
    return None if obj is None else {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}


def _both(monkeypatch, digest: str, slug: str | None) -> tuple[front.Front, front.Front, int]:
    with CaptureQueriesContext(connection) as one:
        fast = front.front_read(digest, slug)
    monkeypatch.setattr(front, "ONE_STATEMENT", False)
    slow = front.front_read(digest, slug)
    monkeypatch.setattr(front, "ONE_STATEMENT", True)
    return fast, slow, len(one.captured_queries)


def _same(fast: front.Front, slow: front.Front) -> None:
    assert _values(fast.key) == _values(slow.key)
    assert _values(fast.route) == _values(slow.route)
    assert _values(fast.wallet) == _values(slow.wallet)
    if slow.key is not None:
        assert _values(fast.key.tenant) == _values(slow.key.tenant)
        assert TenantApiKey.tenant.is_cached(fast.key)
    if slow.route is not None:
        assert _values(fast.route.network) == _values(slow.route.network)
        assert PricedRoute.network.is_cached(fast.route)


@pytest.mark.parametrize("slug", ["paid", "both", "nope", "x" * 65, None])
def test_one_statement_reads_what_the_orm_reads(tenant, chain_routes, monkeypatch, slug):
    digest = key_digest(tenant_api_key_create(tenant=tenant, label="t")[1])
    fast, slow, queries = _both(monkeypatch, digest, slug)
    _same(fast, slow)
    assert fast.key is not None and fast.key.tenant.pk == tenant.pk
    assert (fast.route is not None) == (slug in ("paid", "both"))
    assert queries == 1


def test_a_route_without_a_network_and_an_unknown_key(tenant, routes, monkeypatch):  # noqa: F811
    digest = key_digest(tenant_api_key_create(tenant=tenant, label="t")[1])
    fast, slow, _ = _both(monkeypatch, digest, "ok")
    _same(fast, slow)
    assert fast.route.slug == "ok" and fast.route.network is None
    fast, slow, _ = _both(monkeypatch, key_digest("ak_nobody"), "ok")
    assert fast == slow == front.Front(None, None)


def test_revocation_and_route_changes_take_effect_at_the_next_read(tenant, chain_routes):
    key, raw = tenant_api_key_create(tenant=tenant, label="t")
    assert front.front_read(key_digest(raw), "paid").route.price_minor == 150
    PricedRoute.objects.filter(slug="paid").update(price_minor=7)
    assert front.front_read(key_digest(raw), "paid").route.price_minor == 7
    PricedRoute.objects.filter(slug="paid").update(active=False)
    read = front.front_read(key_digest(raw), "paid")
    assert read.key is not None and read.route is None
    TenantApiKey.objects.filter(pk=key.pk).update(revoked_at=timezone.now())
    assert front.front_read(key_digest(raw), "paid") == front.Front(None, None)
