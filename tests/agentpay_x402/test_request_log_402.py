"""The unpaid 402's request row (agentpay/api/request_log.py, `request_log_expect`): written with
its answer by the open's one statement, no UPDATE after it, and still corrected by the UPDATE
whenever the answer sent is another; the 402 logged once, by the gateway's own line."""

from __future__ import annotations

import logging

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agentpay.api import onchain as gateway_onchain
from agentpay.models import GatewayRequest

pytestmark = pytest.mark.django_db


def _log_writes(captured: CaptureQueriesContext) -> list[str]:
    return [q["sql"].split(" ")[0] for q in captured.captured_queries
            if '"agentpay_gatewayrequest"' in q["sql"] and q["sql"].startswith(("INSERT", "UPDATE", "WITH"))]


def test_the_402_row_is_written_with_its_answer_and_not_updated(call, chain_routes, network):
    with CaptureQueriesContext(connection) as captured:
        answer = call("paid", "k-1")
    assert answer.status_code == 402
    assert _log_writes(captured) == ["WITH"]  # the open's statement; no UPDATE
    row = GatewayRequest.objects.get()
    assert str(row.request_id) == answer["X-Request-Id"]
    assert (row.answer_status, row.answer_problem, row.intent.idempotency_key) == (402, "payment-required", "k-1")
    assert row.answered_at >= row.received_at and 0 <= row.duration_ms < 60_000


def test_an_answer_other_than_the_expected_402_is_written_over_it(call, chain_routes, network, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("the answer broke after the open")

    monkeypatch.setattr(gateway_onchain, "_payment_required", broken)
    with CaptureQueriesContext(connection) as captured:
        assert call("paid", "k-x").status_code == 500
    assert _log_writes(captured) == ["WITH", "UPDATE"]
    row = GatewayRequest.objects.get()
    assert (row.answer_status, row.answer_problem) == (500, "internal-error") and row.intent_id is not None


def test_a_replay_of_the_challenge_is_recorded_with_its_own_402(call, chain_routes, network):
    first = call("paid", "k-r")
    again = call("paid", "k-r")
    assert again.status_code == 402 and again["PAYMENT-REQUIRED"] == first["PAYMENT-REQUIRED"]
    rows = GatewayRequest.objects.order_by("received_at")
    assert [(r.answer_status, r.answer_problem) for r in rows] == [(402, "payment-required")] * 2
    assert len({r.request_id for r in rows}) == 2 and rows[0].intent_id == rows[1].intent_id


def test_the_402_is_not_a_django_request_warning_but_keeps_its_gateway_line(call, chain_routes, network,
                                                                            caplog):
    with caplog.at_level(logging.INFO):
        answer = call("paid", "k-log")
        assert call("nope", "k-404").status_code == 404
    assert answer.status_code == 402
    warned = [r.getMessage() for r in caplog.records if r.name == "django.request"]
    assert warned == ["Not Found: /agentpay/v1/routes/nope/run"]  # other 4xx still warn
    lines = [r.getMessage() for r in caplog.records if r.name == "agentpay.gateway"]
    assert f"request_id={answer['X-Request-Id']} POST /agentpay/v1/routes/paid/run → 402" in lines
