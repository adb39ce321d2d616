"""A hold's capture or release in one statement (agentpay/services/ledger_writes.py) writes what
the ORM writes: the same transfer row and the same account totals, and a second resolution of
one hold is refused in both, with nothing written and the caller's transaction still usable."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from agentpay.bridge import trusted_now
from agentpay.models import LedgerAccount, PaymentIntent, Transfer
from agentpay.services import ledger_writes
from agentpay.services.intents import intent_open
from agentpay.services.ledger import LedgerRefusal, ledger_capture, ledger_release
from agentpay.services.wallet_flow import authorize_and_hold

pytestmark = pytest.mark.django_db


def _held(tenant, route, key: str) -> Transfer:
    opened = intent_open(tenant=tenant, route=route, rail="wallet", idempotency_key=key, digest="d",
                         forward_path="", forward_query="", content_type="", body=b"", request_id=uuid.uuid4(),
                         now=trusted_now(), steps=authorize_and_hold(route.price_minor))
    assert opened.lines.settlement == "held"
    return Transfer.objects.get(intent=opened.intent, kind="pending")


def _totals(hold: Transfer) -> list[tuple[int, int, int, int]]:
    return [tuple(LedgerAccount.objects.filter(pk=pk).values_list(
        "debits_posted", "credits_posted", "debits_pending", "credits_pending").get())
        for pk in (hold.debit_account_id, hold.credit_account_id)]


def _row(transfer: Transfer, hold: Transfer) -> dict[str, Any]:
    values = {f.name: getattr(transfer, f.attname) for f in Transfer._meta.concrete_fields
              if f.name not in ("id", "transfer_id", "intent", "pending")}
    values["names_its_hold"] = transfer.pending_id == hold.pk and transfer.intent_id == hold.intent_id
    return values


def _resolve(resolve, tenant, route, key: str, now: datetime) -> tuple[dict[str, Any], list[tuple], int]:
    hold = _held(tenant, route, key)
    before = _totals(hold)
    with transaction.atomic(), CaptureQueriesContext(connection) as captured:
        made = resolve(hold=hold, actor="test", now=now, reason="why", ticket="T-9")
    moved = [tuple(a - b for a, b in zip(after, was, strict=True)) for after, was in zip(_totals(hold), before,
                                                                                            strict=True)]
    stored = Transfer.objects.get(pk=made.pk)
    assert _row(stored, hold) == _row(made, hold)  # the instance is the row
    return _row(stored, hold), moved, len(captured.captured_queries)


@pytest.mark.parametrize("resolve", [ledger_capture, ledger_release], ids=["capture", "release"])
def test_the_one_statement_resolves_a_hold_as_the_orm_does(funded, routes, monkeypatch, resolve):
    assert connection.vendor == "postgresql"
    now = trusted_now()
    one = _resolve(resolve, funded, routes["ok"], "one", now)
    monkeypatch.setattr(ledger_writes, "ONE_STATEMENT", False)
    orm = _resolve(resolve, funded, routes["ok"], "orm", now)
    assert one[:2] == orm[:2]
    amount = routes["ok"].price_minor
    posted = amount if resolve is ledger_capture else 0
    assert one[1] == [(posted, 0, -amount, 0), (0, posted, 0, -amount)]  # wallet, then the revenue account
    assert (one[2], orm[2]) == (1, 5)  # one statement; savepoint, INSERT, release, two UPDATEs


@pytest.mark.parametrize("one_statement", [True, False], ids=["one-statement", "orm"])
def test_a_hold_is_resolved_once_and_the_refusal_writes_nothing(funded, routes, monkeypatch, one_statement):
    monkeypatch.setattr(ledger_writes, "ONE_STATEMENT", one_statement)
    hold = _held(funded, routes["ok"], "twice")
    now = trusted_now()
    with transaction.atomic():
        ledger_capture(hold=hold, actor="test", now=now)
        resolved = _totals(hold)
        with pytest.raises(LedgerRefusal, match="HOLD_ALREADY_RESOLVED"):
            ledger_release(hold=hold, actor="test", now=now)
        assert _totals(hold) == resolved  # no account moved for the refused release
        assert PaymentIntent.objects.filter(pk=hold.intent_id).exists()  # the transaction is still usable
    assert list(Transfer.objects.filter(pending=hold).values_list("kind", flat=True)) == ["post_pending"]


def test_the_one_statement_holds_as_the_orm_does(funded, routes, monkeypatch):
    def pending() -> list[int]:  # the wallet's pending debits, the revenue accounts' pending credits
        return [LedgerAccount.objects.get(kind="wallet", tenant=funded).debits_pending,
                sum(LedgerAccount.objects.filter(kind="revenue").values_list("credits_pending", flat=True))]

    def hold(key: str) -> tuple[dict[str, Any], list[int]]:
        before = pending()
        made = _held(funded, routes["ok"], key)
        row = _row(Transfer.objects.get(pk=made.pk), made)
        row["names_its_hold"] = made.pending_id is None  # a hold names none
        row["reason"] = row["reason"].replace(made.intent.intent_id, "pi_*")
        row["created_at"] = row["created_at"] == made.intent.created_at  # the open's clock
        return row, [a - b for a, b in zip(pending(), before, strict=True)]

    _held(funded, routes["ok"], "warm")  # the revenue shard's id is cached: the one statement applies
    with CaptureQueriesContext(connection) as captured:
        one = hold("one")
    # The hold's CTEs in the open's statement of its rows (open_writes), not a statement of their own.
    sql = [q["sql"] for q in captured.captured_queries]
    assert [s for s in sql if 'c AS (UPDATE "agentpay_ledgeraccount"' in s] == [
        s for s in sql if s.startswith('WITH i AS (SELECT') and '"agentpay_settlement"' in s]
    assert len([s for s in sql if 'c AS (UPDATE "agentpay_ledgeraccount"' in s]) == 1
    assert not [s for s in sql if s.startswith("WITH c AS")]
    monkeypatch.setattr(ledger_writes, "ONE_STATEMENT", False)
    with CaptureQueriesContext(connection) as captured:
        orm = hold("orm")
    assert not [q for q in captured.captured_queries if q["sql"].startswith("WITH c AS")]
    assert one == orm and one[1] == [routes["ok"].price_minor] * 2 and one[0]["kind"] == "pending"
