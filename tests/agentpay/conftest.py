"""Actors and worlds for the AgentPay tests: a tenant with a funded wallet and an API key, a
billing lead, priced routes pointing at a real upstream server on loopback, and the ledger
auditor run after every test."""

from __future__ import annotations

import pytest
from django.db.models import Sum

from agentpay.api.auth import tenant_api_key_create
from agentpay.models import LedgerAccount, PricedRoute, Tenant, Transfer
from agentpay.services.topups import wallet_staff_credit
from tests.agentpay.upstream_server import Upstream
from tests.support.actors import LEADS, make_user, role, staff_roles_from_migration


def ledger_audit() -> None:
    """The ledger's invariants: debits = credits (posted and pending), no wallet below zero
    available, every account's totals equal its transfers, no hold resolved twice."""
    totals = LedgerAccount.objects.aggregate(dp=Sum("debits_posted"), cp=Sum("credits_posted"),
                                             dpe=Sum("debits_pending"), cpe=Sum("credits_pending"))
    assert (totals["dp"] or 0) == (totals["cp"] or 0)
    assert (totals["dpe"] or 0) == (totals["cpe"] or 0)
    for account in LedgerAccount.objects.all():
        if account.kind == "wallet":
            assert account.available >= 0, account
        posted_d = sum(t.amount for t in Transfer.objects.filter(debit_account=account, kind__in=["posted",
                                                                                                   "post_pending"]))
        posted_c = sum(t.amount for t in Transfer.objects.filter(credit_account=account, kind__in=["posted",
                                                                                                    "post_pending"]))
        assert (account.debits_posted, account.credits_posted) == (posted_d, posted_c), account
        open_holds = Transfer.objects.filter(kind="pending").exclude(
            pk__in=Transfer.objects.filter(pending__isnull=False).values("pending"))
        assert account.debits_pending == sum(t.amount for t in open_holds.filter(debit_account=account))
        assert account.credits_pending == sum(t.amount for t in open_holds.filter(credit_account=account))
    resolved = list(Transfer.objects.filter(pending__isnull=False).values_list("pending", flat=True))
    assert len(resolved) == len(set(resolved)), "a hold was resolved twice"


@pytest.fixture(autouse=True)
def audited_ledger(request):
    yield
    if "db" in request.fixturenames or "transactional_db" in request.fixturenames:
        ledger_audit()


@pytest.fixture
def lead(db, django_user_model):
    user = make_user("lead", staff=True)
    # Transactional tests flush the tables the migrations filled (the groups and their grants, the
    # admin's view permissions included): the role migrations' own code makes them again.
    staff_roles_from_migration()
    user.groups.add(role(LEADS, app_label="agentpay", codenames=["resolve_review", "credit_wallet"]))
    return django_user_model.objects.get(pk=user.pk)  # fresh permission cache


@pytest.fixture
def upstream():
    server = Upstream().start()
    yield server
    server.stop()


@pytest.fixture
def tenant(db):
    return Tenant.objects.create(name="Acme agents")


@pytest.fixture
def funded(tenant, lead):
    wallet_staff_credit(tenant=tenant, currency="usd", amount=1000, user=lead, reason="test float", ticket="T-1")
    return tenant


@pytest.fixture
def api_key(tenant):
    return tenant_api_key_create(tenant=tenant, label="test")[1]


@pytest.fixture
def routes(db, upstream):
    def make(slug: str, path: str, *, method: str = "POST", price: int = 150, read_timeout: float = 5.0):
        return PricedRoute.objects.create(
            slug=slug, name=slug, upstream_base_url=upstream.base_url, upstream_path=path, method=method,
            price_minor=price, currency="usd", rails_allowed=["wallet"], connect_timeout_seconds=1.0,
            read_timeout_seconds=read_timeout, status_query_url=f"{upstream.base_url}/status")

    return {
        "ok": make("ok", "/ok"), "bad": make("bad", "/bad"), "boom": make("boom", "/boom"),
        "hang": make("hang", "/hang", read_timeout=0.5), "drop": make("drop", "/drop"),
        "lookup": make("lookup", "/ok", method="GET"), "pricey": make("pricey", "/ok", price=5000),
    }


@pytest.fixture
def call(client, api_key):
    def do(route: str, key: str | None = "k-1", *, body: bytes = b'{"q": 1}', method: str = "post",
           content_type: str = "application/json", **headers: str):
        extra = {f"HTTP_{name.upper().replace('-', '_')}": value for name, value in headers.items()}
        if key is not None:
            extra["HTTP_IDEMPOTENCY_KEY"] = key
        extra.setdefault("HTTP_AUTHORIZATION", f"Bearer {api_key}")  # authorization="…" overrides it
        url = f"/agentpay/v1/routes/{route}/run"
        if method == "get":
            return client.get(url, **extra)
        return getattr(client, method)(url, data=body, content_type=content_type, **extra)

    return do
