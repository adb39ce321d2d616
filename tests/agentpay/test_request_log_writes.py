"""When a priced call's request row is written (agentpay/api/request_log.py): with the first
thing the call changes. The open writes it with the intent (the 402's one statement, the
wallet's open transaction); a call whose key finds an intent has it written before anything is
done with the intent; a call refused before the open, or failing, has it written once with its
answer. Every path: one row per request, with its answer, and never an intent without its row."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agentpay.api import views
from agentpay.models import GatewayRequest, PaymentIntent
from agentpay.services import wallet_flow

pytestmark = pytest.mark.django_db


def _log_statements(captured: CaptureQueriesContext) -> list[str]:
    return [q["sql"][:30] for q in captured.captured_queries
            if '"agentpay_gatewayrequest"' in q["sql"] and q["sql"].startswith(("INSERT", "UPDATE"))]


def test_the_wallet_open_writes_the_row_before_the_upstream_is_called(funded, routes, call, monkeypatch):
    seen = {}

    def forward(**kwargs):  # a crash here must leave the intent with its request's row
        intent = PaymentIntent.objects.get(idempotency_key="k-w")
        seen["rows"] = list(GatewayRequest.objects.filter(intent=intent).values_list("tenant_id", "answer_status"))
        raise ConnectionError("upstream unreachable")

    monkeypatch.setattr(wallet_flow, "upstream_forward", forward)
    assert call("ok", "k-w").status_code == 500
    assert seen["rows"] == [(funded.pk, None)]
    row = GatewayRequest.objects.get(idempotency_key="k-w")  # answered (500) by the same row
    assert row.answer_status == 500 and row.intent.idempotency_key == "k-w"


def test_a_call_refused_before_the_open_is_one_insert_with_its_answer(funded, routes, call):
    with CaptureQueriesContext(connection) as captured:
        assert call("nope", "k-404").status_code == 404
        assert call("ok", "k-401", authorization="Bearer ak_wrong").status_code == 401
        assert call("ok", None).status_code == 400
    assert [s.split(" ")[0] for s in _log_statements(captured)] == ["INSERT"] * 3
    answers = sorted(GatewayRequest.objects.values_list("answer_status", "answer_problem", "intent_id"))
    assert answers == [(400, "idempotency-key-required", None), (401, "authentication-failed", None),
                       (404, "unknown-route", None)]


def test_a_key_that_finds_an_intent_has_its_row_written_before_the_intent_is_touched(funded, routes, call,
                                                                                    monkeypatch):
    assert call("ok", "k-r").status_code == 200
    seen = {}
    real = views._replay

    def replay(intent):
        seen["rows"] = GatewayRequest.objects.filter(intent=intent).count()
        return real(intent)

    monkeypatch.setattr(views, "_replay", replay)
    with CaptureQueriesContext(connection) as captured:
        assert call("ok", "k-r").status_code == 200
    assert seen["rows"] == 2  # the first call's and this one's, written before the replay was read
    assert [s.split(" ")[0] for s in _log_statements(captured)] == ["INSERT", "UPDATE"]
    assert list(GatewayRequest.objects.values_list("answer_status", flat=True)) == [200, 200]


def test_a_failing_view_still_leaves_the_row_with_its_answer(funded, routes, call, monkeypatch):
    def broken(**kwargs):
        raise RuntimeError("the open broke")

    monkeypatch.setattr(views, "intent_open", broken)
    assert call("ok", "k-x").status_code == 500
    row = GatewayRequest.objects.get(idempotency_key="k-x")
    assert row.answer_status == 500 and row.intent_id is None and row.tenant_id == funded.pk
