"""insert_values (agentpay/services/insert_values.py) sends what Django's own INSERT would send
(dunning's insert_params: pre_save + get_db_prep_save per field), value for value and type for
type (an int typed by its column, JSON wrapped), for every model an open writes."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.db.models import Model
from django.db.models.fields import timezone as fields_timezone

from agentpay.bridge import insert_params
from agentpay.models import (
    Fulfillment,
    GatewayRequest,
    IntentReceipt,
    OutboxMessage,
    PaymentChallenge,
    PaymentIntent,
    Settlement,
)
from agentpay.services.insert_values import insert_values
from tests.agentpay.conftest import funded, lead, routes  # noqa: F401

pytestmark = pytest.mark.django_db
NOW = datetime(2026, 12, 4, 7, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _still_clock(monkeypatch):
    """auto_now_add stamps the clock in pre_save: the same instant for both conversions."""
    monkeypatch.setattr(fields_timezone, "now", lambda: NOW)
OPEN_MODELS = (PaymentIntent, Settlement, Fulfillment, PaymentChallenge, GatewayRequest, IntentReceipt, OutboxMessage)


def _comparable(values: list[Any]) -> list[tuple[type, Any]]:
    return [(type(v), getattr(v, "obj", v)) for v in values]  # psycopg's Jsonb has no __eq__: its document


def _same(obj: Model, but: str = "") -> None:
    assert _comparable(insert_values(connection, obj, but)) == _comparable(insert_params(connection, obj, but))


def test_the_rows_of_an_unpaid_and_a_paid_open_convert_as_django_converts_them(call, chain_routes, network,
                                                                               funded, routes):  # noqa: F811
    assert call("paid", "k-1").status_code == 402
    assert call("ok", "k-2").status_code == 200
    for model in OPEN_MODELS:
        rows = list(model.objects.all())
        assert rows, model
        for row in rows:
            _same(row)
            if model is not PaymentIntent:
                _same(row, "intent")


def test_values_of_other_types_take_django_s_way():
    naive = datetime(2026, 1, 2, 3, 4, 5)
    aware = naive.replace(tzinfo=UTC)
    big = 2**40  # past Int4: the column's Int8, not a bare int
    row = GatewayRequest(request_id=str(uuid.uuid4()), received_at=aware, method="POST", path="/p", query="",
                         headers={"a": "b"}, body=b"x", body_size=big, body_digest="d", body_truncated=1,
                         idempotency_key="k", answer_status=None, answer_problem="", answered_at=None, duration_ms=7)
    _same(row)
    challenge = PaymentChallenge(intent_id=5, network_id=2, pay_to="0x", asset="0x", amount=Decimal("10.0"),
                                 issued_at=aware, expires_at=aware + timedelta(seconds=300), requirement=None)
    _same(challenge)
    receipt = IntentReceipt(intent_id=1, line="intent", event="opened", accepted=True, from_state="", to_state="x",
                            generation=big, data={}, cause_kind="request", actor="a", request_id=uuid.uuid4(),
                            trusted_time=aware, recorded_at=aware)
    _same(receipt)
    values = insert_values(connection, receipt)
    assert type(values[[f.name for f in IntentReceipt._meta.local_concrete_fields if not f.primary_key]
                        .index("generation")]).__name__ == "Int8"
    with pytest.warns(RuntimeWarning):  # a naive datetime: Django's warning and conversion, not kept as it is
        _same(PaymentIntent(tenant_id=1, idempotency_key="k", request_digest="d", rail="onchain", route_id=1,
                            amount=1, currency="usd", created_at=naive, state_changed_at=aware))
