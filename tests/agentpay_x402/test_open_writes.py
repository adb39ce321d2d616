"""intent_open's one statement (agentpay/services/open_writes.py) writes the rows the ORM writes.

The 402's open (intent challenged, settlement, fulfillment, challenge, two receipts, the outbox
row) and a plain open (no steps) are made twice with the same inputs, once as the one
statement on PostgreSQL and once through the ORM (the SQLite demo's path), and every column of
every row is compared, the generated ids and the intent's own id masked."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agentpay.bridge import trusted_now
from agentpay.models import (
    Fulfillment,
    IntentReceipt,
    OutboxMessage,
    PaymentChallenge,
    PaymentIntent,
    Settlement,
)
from agentpay.services import open_writes
from agentpay.services.intents import intent_open
from agentpay.services.results import Step
from agentpay.states import INTENT
from tests.agentpay.rows import intent_rows

pytestmark = pytest.mark.django_db

GENERATED = {"id", "intent", "intent_id", "settlement_id", "fulfillment_id", "challenge_id", "idempotency_key",
             "recorded_at"}


def _rows(intent: PaymentIntent) -> dict[str, list[dict[str, Any]]]:
    return intent_rows(intent, (Settlement, Fulfillment, PaymentChallenge, IntentReceipt, OutboxMessage), GENERATED)


def _open(tenant, route, key: str, steps: list[Step], now: datetime, request_id: uuid.UUID) -> PaymentIntent:
    opened = intent_open(tenant=tenant, route=route, rail="onchain", idempotency_key=key, digest="d" * 64,
                         forward_path="run", forward_query="a=1", content_type="application/json", body=b'{"q": 1}',
                         request_id=request_id, now=now, steps=steps, lease=not steps)
    assert opened.created
    return opened.intent


@pytest.mark.parametrize("challenged", [True, False], ids=["challenged", "plain"])
def test_the_one_statement_writes_the_rows_the_orm_writes(tenant, chain_routes, monkeypatch, challenged):
    assert connection.vendor == "postgresql"
    route, now, request_id = chain_routes["paid"], trusted_now(), uuid.uuid4()
    steps = [Step(INTENT, "challenge_issued", {"resource": "http://testserver/agentpay/v1/routes/paid/run"})] \
        if challenged else []
    with CaptureQueriesContext(connection) as one:
        fast = _open(tenant, route, "one", steps, now, request_id)
    monkeypatch.setattr(open_writes, "ONE_STATEMENT", False)
    with CaptureQueriesContext(connection) as orm:
        slow = _open(tenant, route, "orm", steps, now, request_id)
    inserts = [q["sql"] for q in one.captured_queries if "INSERT" in q["sql"]]
    assert len(inserts) == 1 and inserts[0].startswith("WITH i AS (INSERT")
    assert sum("INSERT" in q["sql"] for q in orm.captured_queries) == (6 if challenged else 4)
    assert _rows(fast) == _rows(slow)
    fast_rows = _rows(fast)
    assert fast_rows["intent"][0]["state"] == ("challenged" if challenged else "created")
    assert [r["event"] for r in fast_rows["IntentReceipt"]] == (["opened", "challenge_issued"] if challenged
                                                              else ["opened"])
    assert len(fast_rows["PaymentChallenge"]) == len(fast_rows["OutboxMessage"]) == int(challenged)
    # The objects the open hands back are saved ones: their keys are the rows'.
    assert fast.pk == PaymentIntent.objects.get(idempotency_key="one").pk and not fast._state.adding


def test_a_taken_key_in_the_one_statement_finds_the_first_intent(tenant, chain_routes):
    route, now = chain_routes["paid"], trusted_now()
    steps = [Step(INTENT, "challenge_issued", {"resource": "http://testserver/agentpay/v1/routes/paid/run"})]
    first = _open(tenant, route, "same", steps, now, uuid.uuid4())
    again = intent_open(tenant=tenant, route=route, rail="onchain", idempotency_key="same", digest="d" * 64,
                        forward_path="run", forward_query="a=1", content_type="application/json", body=b'{"q": 1}',
                        request_id=uuid.uuid4(), now=now, steps=steps, lease=False)
    assert not again.created and again.intent.pk == first.pk
    assert PaymentChallenge.objects.filter(intent=first).count() == 1
    assert IntentReceipt.objects.filter(intent=first).count() == 2
