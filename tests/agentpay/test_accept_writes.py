"""An accepted generation's writes in one statement (agentpay/services/accept_writes.py) are the
rows the ORM writes.

A wallet paid call (authorize + hold, dispatch, the upstream's 2xx with capture and the lease
cleared) is accepted twice with the same inputs, once as one statement per acceptance on
PostgreSQL and once through the ORM (the SQLite demo's path), and every column of the intent,
settlement, fulfillment, receipts and outbox rows is compared, generated ids masked. A
compare-and-set that finds another generation writes nothing on either path."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from agentpay.bridge import trusted_now
from agentpay.models import (
    Fulfillment,
    IntentReceipt,
    LedgerAccount,
    OutboxMessage,
    PaymentIntent,
    Settlement,
    Transfer,
)
from agentpay.services import accept_writes, open_writes
from agentpay.services.accept_writes import AcceptWrites, accept_write
from agentpay.services.acceptance import accepted_receipt, intent_accept, outbox_message
from agentpay.services.intents import intent_open
from agentpay.services.ledger import ledger_capture
from agentpay.services.locking import lock_intent
from agentpay.services.results import Cause, Step
from agentpay.services.wallet_flow import authorize_and_hold, open_steps
from agentpay.states import Lines
from tests.agentpay.rows import intent_rows

pytestmark = pytest.mark.django_db

GENERATED = {"id", "intent", "intent_id", "idempotency_key", "settlement_id", "fulfillment_id", "hold", "recorded_at"}
STEPS = [[Step("intent", "payload_verified"), Step("settlement", "hold_acquired")], [Step("fulfillment", "dispatch")],
         [Step("fulfillment", "upstream_2xx", {"status": 200}), Step("settlement", "capture"),
          Step("intent", "settlement_confirmed")]]


def _rows(intent: PaymentIntent) -> dict[str, list[dict[str, Any]]]:
    return intent_rows(intent, (Settlement, Fulfillment, IntentReceipt, OutboxMessage), GENERATED)


def _paid(tenant, route, key: str, now: datetime, cause: Cause) -> tuple[PaymentIntent, list[int]]:
    intent = intent_open(tenant=tenant, route=route, rail="wallet", idempotency_key=key, digest="d", forward_path="",
                         forward_query="", content_type="", body=b"", request_id=cause.request_id, now=now).intent
    writes = []
    for n, steps in enumerate(STEPS):
        with CaptureQueriesContext(connection) as captured:
            outcome = intent_accept(intent_id=intent.intent_id, steps=steps, cause=cause, now=now,
                                    release_lease=n == len(STEPS) - 1)
        assert outcome.accepted, outcome
        assert list(outcome.receipt_ids) == list(IntentReceipt.objects.filter(
            intent=intent, generation=outcome.generation).order_by("pk").values_list("pk", flat=True))
        writes.append(sum(q["sql"].startswith(("UPDATE", "INSERT", "WITH i AS")) for q in captured.captured_queries))
    return intent, writes


def test_the_one_statement_writes_the_rows_the_orm_writes(funded, routes, monkeypatch):
    assert connection.vendor == "postgresql"
    now, cause = trusted_now(), Cause.request(uuid.uuid4(), funded.tenant_id)
    fast, fast_writes = _paid(funded, routes["ok"], "one", now, cause)
    monkeypatch.setattr(accept_writes, "ONE_STATEMENT", False)
    slow, slow_writes = _paid(funded, routes["ok"], "orm", now, cause)
    rows = _rows(fast)
    assert rows == _rows(slow)
    assert rows["intent"][0]["state"] == "completed" and rows["intent"][0]["generation"] == 3
    assert rows["intent"][0]["processing_until"] is None
    assert rows["Fulfillment"][0]["upstream_status_code"] == 200 and rows["Fulfillment"][0]["dispatched_at"] == now
    assert [r["event"] for r in rows["IntentReceipt"]] == ["opened", "payload_verified", "hold_acquired", "dispatch",
                                                          "upstream_2xx", "capture", "settlement_confirmed"]
    assert len(rows["OutboxMessage"]) == 3
    # The ledger's statements aside (the capture's is a `WITH t`): one write per acceptance, not 4-5.
    assert slow_writes[1:] == [4, 5] and fast_writes[1:] == [1, 1]


@pytest.mark.parametrize("one_statement", [True, False], ids=["one-statement", "orm"])
def test_a_compare_and_set_on_another_generation_writes_nothing(funded, routes, monkeypatch, one_statement):
    monkeypatch.setattr(accept_writes, "ONE_STATEMENT", one_statement)
    now, cause = trusted_now(), Cause.system("test")
    intent = intent_open(tenant=funded, route=routes["ok"], rail="wallet", idempotency_key="cas", digest="d",
                         forward_path="", forward_query="", content_type="", body=b"", request_id=uuid.uuid4(),
                         now=now).intent
    before = _rows(intent)
    step = Step("intent", "payload_verified")
    with transaction.atomic():
        locked, settlement, fulfillment, _ = lock_intent(intent.intent_id, wallet=False)
        stale = locked.generation + 1  # as if another acceptance had moved it on
        locked.state = "authorized"
        lines = Lines(rail="wallet", intent="authorized", settlement="not_started", fulfillment="not_started")
        written = accept_write(AcceptWrites(
            intent=locked, loaded_generation=stale, intent_fields={"generation": stale + 1, "state": "authorized"},
            settlement=settlement, settlement_fields=["state"], fulfillment=fulfillment,
            fulfillment_fields=["state"], receipts=[accepted_receipt(locked, step, "created", "authorized",
                                                                     stale + 1, cause, now)],
            outbox=outbox_message(locked, lines, [step], cause, now)))
    assert written is False
    assert _rows(intent) == before


def test_a_wallet_open_with_its_hold_writes_the_rows_the_orm_writes(funded, routes, monkeypatch):
    """The open's rows after the intent and its hold (open_writes with the intent inserted already)."""
    now, request_id = trusted_now(), uuid.uuid4()

    def opened(key: str) -> tuple[PaymentIntent, int]:
        with CaptureQueriesContext(connection) as captured:
            made = intent_open(tenant=funded, route=routes["ok"], rail="wallet", idempotency_key=key, digest="d",
                               forward_path="", forward_query="", content_type="", body=b"", request_id=request_id,
                               now=now, steps=authorize_and_hold(routes["ok"].price_minor))
        assert made.created and made.lines.settlement == "held" and not made.intent._state.adding
        assert made.intent.fulfillment.pk == Fulfillment.objects.get(intent=made.intent).pk
        return made.intent, sum(not q["sql"].startswith(("SAVEPOINT", "RELEASE")) for q in captured.captured_queries)

    opened("warm")  # the revenue shard's id is cached: the hold is its one statement on both paths
    fast, fast_statements = opened("one")
    monkeypatch.setattr(open_writes, "ONE_STATEMENT", False)
    slow, slow_statements = opened("orm")
    assert _rows(fast) == _rows(slow)
    assert [r["event"] for r in _rows(fast)["IntentReceipt"]] == ["opened", "payload_verified", "hold_acquired"]
    assert Settlement.objects.get(intent=fast).hold.intent_id == fast.pk
    # The intent with the wallet's lock, then the hold with the rest; the ORM: the intent, the
    # lock, the hold, one INSERT for each of the rest.
    assert (fast_statements, slow_statements) == (2, 7)


@pytest.mark.parametrize("one_statement", [True, False], ids=["one-statement", "orm"])
def test_an_open_that_finds_no_wallet_to_hold_on_is_opened_plainly(funded, routes, monkeypatch, one_statement):
    monkeypatch.setattr(open_writes, "ONE_STATEMENT", one_statement)
    LedgerAccount.objects.filter(kind="wallet", tenant=funded).update(currency="eur")
    made = intent_open(tenant=funded, route=routes["ok"], rail="wallet", idempotency_key="nowallet", digest="d",
                       forward_path="", forward_query="", content_type="", body=b"", request_id=uuid.uuid4(),
                       now=trusted_now(), steps=authorize_and_hold(routes["ok"].price_minor))
    assert made.created and made.lines.intent == "created"
    assert list(PaymentIntent.objects.filter(tenant=funded).values_list("pk", "state")) == [(made.intent.pk,
                                                                                           "created")]
    assert not Transfer.objects.filter(intent=made.intent).exists()


def _answered(tenant, route, key: str, now: datetime, cause: Cause) -> tuple[PaymentIntent, list[str]]:
    """A wallet call opened with its hold and dispatch, then the upstream's 2xx with its capture:
    the answer's statements."""
    intent = intent_open(tenant=tenant, route=route, rail="wallet", idempotency_key=key, digest="d", forward_path="",
                         forward_query="", content_type="", body=b"", request_id=cause.request_id, now=now,
                         steps=open_steps(route.price_minor)).intent
    with CaptureQueriesContext(connection) as captured:
        assert intent_accept(intent_id=intent.intent_id, steps=STEPS[2], cause=cause, now=now,
                             release_lease=True).accepted
    return intent, [q["sql"] for q in captured.captured_queries]


def test_a_capture_is_written_with_its_generation_as_the_ledger_writes_it(funded, routes, monkeypatch):
    now, cause = trusted_now(), Cause.request(uuid.uuid4(), funded.tenant_id)
    _answered(funded, routes["ok"], "warm", now, cause)  # the revenue shard's id is cached
    wallet = LedgerAccount.objects.get(kind="wallet", tenant=funded)
    revenue = LedgerAccount.objects.get(pk=Transfer.objects.filter(kind="pending").first().credit_account_id)

    def totals() -> list[tuple[int, int, int, int]]:
        return [(a.debits_pending, a.debits_posted, a.credits_pending, a.credits_posted)
                for a in LedgerAccount.objects.filter(pk__in=[wallet.pk, revenue.pk]).order_by("pk")]

    before = totals()
    fast, fast_sql = _answered(funded, routes["ok"], "one", now, cause)
    after_fast = totals()
    monkeypatch.setattr(accept_writes, "ONE_STATEMENT", False)  # the capture its own statement, the rest the ORM's
    slow, slow_sql = _answered(funded, routes["ok"], "orm", now, cause)
    generated = GENERATED | {"transfer_id", "pending", "reason"}
    assert _rows(fast) == _rows(slow)
    transfers = [intent_rows(i, (Transfer,), generated)["Transfer"] for i in (fast, slow)]
    assert transfers[0] == transfers[1] and [t["kind"] for t in transfers[0]] == ["pending", "post_pending"]
    capture = Transfer.objects.get(intent=fast, kind="post_pending")
    assert capture.pending_id == Settlement.objects.get(intent=fast).hold_id and capture.amount == 150
    # Each call moved the totals by the same amounts (debits = credits on both paths).
    moved = [tuple(b - a for a, b in zip(x, y, strict=True)) for x, y in zip(before, after_fast, strict=True)]
    assert moved == [tuple(b - a for a, b in zip(x, y, strict=True)) for x, y in zip(after_fast, totals(), strict=True)]
    assert sorted(moved) == sorted([(0, 150, 0, 0), (0, 0, 0, 150)])
    # The answer: the lock read and one write (the capture in it); before, the capture's own `WITH t`.
    assert not [s for s in fast_sql if s.startswith("WITH t AS")] and [s for s in slow_sql if s.startswith("WITH t AS")]
    assert len([s for s in fast_sql if not s.startswith(("SAVEPOINT", "RELEASE"))]) == 2


def test_a_hold_resolved_behind_the_acceptance_refuses_the_capture_and_writes_nothing(funded, routes):
    now, cause = trusted_now(), Cause.request(uuid.uuid4(), funded.tenant_id)
    intent = intent_open(tenant=funded, route=routes["ok"], rail="wallet", idempotency_key="twice", digest="d",
                         forward_path="", forward_query="", content_type="", body=b"", request_id=cause.request_id,
                         now=now, steps=open_steps(routes["ok"].price_minor)).intent
    with transaction.atomic():  # the hold posted outside the state machine (what its unique `pending` guards)
        ledger_capture(hold=Settlement.objects.get(intent=intent).hold, actor="test", now=now)
    wallet = LedgerAccount.objects.get(kind="wallet", tenant=funded)
    before = _rows(intent)
    outcome = intent_accept(intent_id=intent.intent_id, steps=STEPS[2], cause=cause, now=now)
    assert not outcome.accepted and outcome.refusal_code == "HOLD_ALREADY_RESOLVED"
    assert outcome.refused_step.event == "capture"
    after = _rows(intent)
    refusal = after["IntentReceipt"].pop()
    assert (refusal["accepted"], refusal["event"]) == (False, "capture")
    assert after == before  # no generation, no outbox row, the lines as they were
    assert Transfer.objects.filter(intent=intent).count() == 2  # the hold and the one capture
    assert LedgerAccount.objects.get(pk=wallet.pk).debits_posted == wallet.debits_posted
