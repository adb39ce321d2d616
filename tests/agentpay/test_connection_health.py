"""A gateway call on a persistent connection: no SELECT 1 before its first statement when the
connection is quiet, and a connection the server closed is replaced before the call is recorded."""

from __future__ import annotations

import select
import time

import psycopg
import pytest
from django.db import connections

from agentpay.models import GatewayRequest

pytestmark = pytest.mark.django_db(transaction=True)


def _reused(db_connection) -> None:
    """As a persistent connection is at the start of a request (request_started's
    close_old_connections marks it unchecked; the test client leaves that signal out)."""
    db_connection.ensure_connection()
    db_connection.health_check_done = False


def test_a_quiet_reused_connection_is_not_asked_select_1(client, monkeypatch):
    db_connection = connections["default"]
    _reused(db_connection)
    asked: list[bool] = []
    monkeypatch.setattr(db_connection, "is_usable", lambda: asked.append(True) or True)
    response = client.get("/agentpay/v1/intents/pi_nosuch")
    assert 400 <= response.status_code < 500
    assert asked == [], "Django's health check (SELECT 1) was sent"
    assert db_connection.health_check_done
    assert GatewayRequest.objects.filter(path="/agentpay/v1/intents/pi_nosuch").exists()


def test_a_connection_the_server_closed_is_replaced_before_the_call_is_recorded(client):
    db_connection = connections["default"]
    _reused(db_connection)
    pid = db_connection.connection.info.backend_pid
    with psycopg.connect(**db_connection.get_connection_params(), autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
    deadline = time.monotonic() + 5
    socket = db_connection.connection.pgconn.socket
    while not select.select([socket], [], [], 0.05)[0] and time.monotonic() < deadline:
        pass  # the server's FATAL notice is on its way
    response = client.get("/agentpay/v1/intents/pi_after_restart")
    assert 400 <= response.status_code < 500
    assert db_connection.connection.info.backend_pid != pid
    assert GatewayRequest.objects.filter(path="/agentpay/v1/intents/pi_after_restart").exists()
