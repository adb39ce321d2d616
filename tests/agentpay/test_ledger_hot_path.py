"""The paid call's hot path (bench/last_run/agentpay.md): system accounts sharded and their ids
cached, the wallet locked only by the steps that read it. Shapes of SQL, never timings."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from agentpay.bridge import trusted_now
from agentpay.models import LedgerAccount, PaymentIntent, Tenant, Transfer
from agentpay.services import ledger
from agentpay.services.intents import intent_open
from agentpay.services.ledger import ledger_capture, ledger_hold, system_shard
from agentpay.services.tenants import tenant_create
from agentpay.services.topups import wallet_staff_credit
from agentpay.services.wallet_flow import open_steps

pytestmark = pytest.mark.django_db


def _revenue_of(intent: PaymentIntent) -> LedgerAccount:
    return Transfer.objects.get(intent=intent, kind="pending").credit_account


def test_holds_of_two_wallets_credit_their_own_revenue_shard(lead, routes, call, client, settings):
    settings.AGENTPAY_SYSTEM_ACCOUNT_SHARDS = 4
    from agentpay.api.auth import tenant_api_key_create

    tenants = [tenant_create(name=f"shard {n}") for n in range(5)]
    wallets = {t.pk: LedgerAccount.objects.get(kind="wallet", tenant=t) for t in tenants}
    shards = {system_shard(w.pk) for w in wallets.values()}
    assert len(shards) > 1
    for tenant in tenants:
        wallet_staff_credit(tenant=tenant, currency="usd", amount=1000, user=lead, reason="float", ticket="T-1")
        raw = tenant_api_key_create(tenant=tenant, label="t")[1]
        response = client.post("/agentpay/v1/routes/ok/run", data=b"{}", content_type="application/json",
                               HTTP_IDEMPOTENCY_KEY=f"k-{tenant.pk}", HTTP_AUTHORIZATION=f"Bearer {raw}")
        assert response.status_code == 200
        intent = PaymentIntent.objects.get(tenant=tenant)
        revenue = _revenue_of(intent)
        shard = system_shard(wallets[tenant.pk].pk)
        assert (revenue.kind, revenue.currency, revenue.shard) == ("revenue", "usd", shard)
        assert revenue.credits_posted >= 150 and revenue.credits_pending == 0
        credit = Transfer.objects.filter(credit_account=wallets[tenant.pk], kind="posted").get()
        assert credit.debit_account.shard == system_shard(wallets[tenant.pk].pk)
    revenue = LedgerAccount.objects.filter(kind="revenue", currency="usd")
    assert revenue.count() == len(shards)
    assert sum(a.credits_posted for a in revenue) == 150 * len(tenants)  # reports sum the shards


def test_a_wallet_has_shard_zero_in_the_database(funded):
    wallet = LedgerAccount.objects.get(kind="wallet", tenant=funded)
    with pytest.raises(Exception, match="wallet_shard_zero"), transaction.atomic():
        LedgerAccount.objects.filter(pk=wallet.pk).update(shard=3)


def test_a_stale_cached_system_account_id_is_looked_up_again(funded, routes):
    wallet = LedgerAccount.objects.get(kind="wallet", tenant=funded)
    key = ("revenue", "usd", system_shard(wallet.pk))
    ledger._SYSTEM_IDS[key] = 10**12  # as after a flushed table or a rolled-back first hold
    intent = _authorized(funded, routes["ok"])
    with transaction.atomic():
        locked = LedgerAccount.objects.select_for_update().get(pk=wallet.pk)
        hold = ledger_hold(wallet=locked, amount=150, intent=intent, actor="test", now=intent.created_at)
        ledger_capture(hold=hold, actor="test", now=intent.created_at)
    revenue = LedgerAccount.objects.get(kind="revenue", currency="usd", shard=key[2])
    assert hold.credit_account_id == revenue.pk == ledger._SYSTEM_IDS[key]
    assert (revenue.credits_pending, revenue.credits_posted) == (0, 150)


def test_an_open_whose_hold_finds_a_stale_system_account_id_rolls_back_and_opens_again(funded, routes):
    """The open writes its hold with its rows (open_writes): a stale cached id moves no system
    account, so nothing cites the hold and the open is rolled back, the id forgotten, and the
    open done again with the account looked up: one intent, one hold, the totals moved once."""
    wallet = LedgerAccount.objects.get(kind="wallet", tenant=funded)
    key = ("revenue", "usd", system_shard(wallet.pk))
    ledger.system_account("revenue", "usd", key[2])  # the account exists; the cache is what is stale
    ledger._SYSTEM_IDS[key] = 10**12
    opened = intent_open(tenant=funded, route=routes["ok"], rail="wallet", idempotency_key="stale", digest="d",
                         forward_path="", forward_query="", content_type="", body=b"", request_id=uuid.uuid4(),
                         now=trusted_now(), steps=open_steps(150))
    assert opened.created and opened.lines.settlement == "held"
    revenue = LedgerAccount.objects.get(kind="revenue", currency="usd", shard=key[2])
    assert ledger._SYSTEM_IDS[key] == revenue.pk
    assert PaymentIntent.objects.filter(tenant=funded, idempotency_key="stale").count() == 1
    hold = Transfer.objects.get(intent=opened.intent, kind="pending")
    assert hold.credit_account_id == revenue.pk and opened.intent.settlements.get().hold_id == hold.pk
    assert (LedgerAccount.objects.get(pk=wallet.pk).debits_pending, revenue.credits_pending) == (150, 150)


def _authorized(tenant: Tenant, route) -> PaymentIntent:
    return intent_open(tenant=tenant, route=route, rail="wallet", idempotency_key=uuid.uuid4().hex, digest="d",
                       forward_path="", forward_query="", content_type="", body=b"", request_id=uuid.uuid4(),
                       now=trusted_now()).intent


def test_a_paid_call_locks_the_wallet_only_to_hold_and_never_writes_a_system_account_row(funded, routes, call):
    assert call("ok", key="warm").status_code == 200  # the revenue shard exists and its id is cached
    with CaptureQueriesContext(connection) as captured:
        assert call("ok", key="measured").status_code == 200
    sql = [q["sql"] for q in captured.captured_queries]
    locks = [s for s in sql if "FOR UPDATE" in s]
    assert not [s for s in locks if s.startswith('SELECT "agentpay_ledgeraccount"') or s.endswith((", w", " OF w"))]
    # The wallet is locked by the open's one statement (authorize + hold + dispatch on open), its
    # guarded UPDATE first (open_writes), and by the capture's UPDATE; the answer's acceptance takes
    # its lock read here, inside the test's transaction (outside one it takes none:
    # test_one_statement_paid_call). No acceptance of its own for dispatch.
    opens = [s for s in sql if 'INSERT INTO "agentpay_paymentintent"' in s]
    assert len(opens) == 1 and 'd AS (UPDATE "agentpay_ledgeraccount"' in opens[0]
    assert len(locks) == 1 and locks[0].endswith("FOR UPDATE OF i, s, f")
    assert not [s for s in sql if s.startswith('INSERT INTO "agentpay_ledgeraccount"')]
    account_reads = [s for s in sql if s.startswith('SELECT "agentpay_ledgeraccount"."id"') and "FOR UPDATE" not in s]
    assert not account_reads  # no system account looked up
    # The answer's read and the flow's reads happen once, not after every acceptance.
    assert sum(s.startswith('SELECT "agentpay_paymentintent"') and "FOR UPDATE" not in s for s in sql) <= 3
