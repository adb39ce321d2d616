"""The outbox relay: committed rows are published once to their consumers, with the request_id."""

from __future__ import annotations

import json
import logging

import pytest

from agentpay.jobs import agentpay_job_run
from agentpay.models import OutboxMessage
from agentpay.schedule import JOB_CADENCE
from agentpay.services import outbox

pytestmark = pytest.mark.django_db


def test_the_relay_publishes_each_change_once_with_its_request_id(funded, routes, call, caplog):
    response = call("ok")
    rows = OutboxMessage.objects.filter(intent__intent_id=response["AgentPay-Intent"])
    # One row per accepted generation: the open's authorize + hold + dispatch, the answer with its capture.
    assert rows.count() == 2 and not rows.filter(published_at__isnull=False).exists()
    with caplog.at_level(logging.INFO, logger="agentpay.events"):
        run = agentpay_job_run("agentpay_outbox_relay")
    assert run.changed == rows.count() and run.errors == 0
    assert not rows.filter(published_at__isnull=True).exists()
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "agentpay.events"]
    assert {line["request_id"] for line in lines} == {response["X-Request-Id"]}
    assert lines[-1]["display_status"] == "COMPLETED"
    assert agentpay_job_run("agentpay_outbox_relay").changed == 0  # nothing twice
    assert "agentpay_outbox_relay" in JOB_CADENCE


def test_a_failing_consumer_leaves_the_row_for_the_next_run(funded, routes, call, monkeypatch):
    call("ok")

    def broken(message):
        raise RuntimeError("downstream is down")

    monkeypatch.setitem(outbox.CONSUMERS, "agentpay.intent.changed", [broken])
    run = agentpay_job_run("agentpay_outbox_relay")
    assert run.errors > 0 and run.changed == 0
    row = OutboxMessage.objects.first()
    assert row.published_at is None and "downstream is down" in row.last_error and row.claimed_until is None
    monkeypatch.setitem(outbox.CONSUMERS, "agentpay.intent.changed", [outbox.log_intent_changed])
    assert agentpay_job_run("agentpay_outbox_relay").changed == run.errors
    row.refresh_from_db()
    assert row.published_at is not None and row.delivery_attempts == 2


def test_a_row_claimed_by_another_relay_is_skipped(funded, routes, call):
    from datetime import timedelta

    from agentpay.bridge import trusted_now

    call("ok")
    now = trusted_now()
    OutboxMessage.objects.update(claimed_until=now + timedelta(seconds=30))
    assert outbox.outbox_relay(now=now).published == 0
    assert outbox.outbox_relay(now=now + timedelta(seconds=31)).published == OutboxMessage.objects.count()
