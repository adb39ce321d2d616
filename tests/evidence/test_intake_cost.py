"""What one webhook delivery costs, pinned (issue 21 item 3): no history row, one statement for a new
event, one Redis command for the hand-off carrying what Celery's own `delay` would carry, and a
broker that is down still loses nothing."""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import os
import select
import time
import uuid

import psycopg
import pytest
import redis
from django.db import connection, connections
from django.test import Client
from django.test.utils import CaptureQueriesContext

from dunning.handoff import redis_push
from dunning.models import EventOutcome, ProviderEvent, WebhookDelivery
from dunning.tasks import process_provider_event
from tests.support.broker import tasks_through
from tests.support.signing import event_body, stripe_signature

URL = "/webhooks/stripe/"
SECRET = "whsec_local"
# The Redis database the broker tests may write to (tests/jobs/test_orphaned_events.py owns it while
# it runs; these only write keys of their own, under a fresh name, and delete them).
REDIS_URL = os.environ.get("DUNNING_TEST_REDIS_URL", "redis://127.0.0.1:6379/14")
# Nothing listens here: connecting is refused at once, as with a broker that is down.
DOWN_BROKER = "redis://127.0.0.1:9/0"


@pytest.fixture(autouse=True)
def webhook_settings(settings):
    settings.STRIPE_WEBHOOK_SECRETS = [SECRET]
    settings.STRIPE_ACCOUNT = "acct_demo"


def deliver(body: bytes):
    return Client().post(URL, data=body, content_type="application/json",
                         HTTP_STRIPE_SIGNATURE=stripe_signature(body, SECRET))


def test_a_new_event_is_one_statement_and_leaves_no_history(db, django_assert_num_queries):
    body = event_body("evt_cost", "invoice.paid")
    with django_assert_num_queries(1):  # the inbox row and its raw request, together
        assert deliver(body).status_code == 200
    event = ProviderEvent.objects.get(event_id="evt_cost")
    delivery = WebhookDelivery.objects.get(claimed_event_id="evt_cost")
    assert (delivery.event_id, delivery.duplicate, delivery.http_status, delivery.verification) == (
        event.pk, False, 200, "VERIFIED")
    assert bytes(delivery.body) == body and event.outcome == EventOutcome.PENDING
    assert event.payload["id"] == "evt_cost" and event.account == "acct_demo" and event.signature_verified
    assert not hasattr(ProviderEvent, "history"), "the inbox row is its own record"
    assert "dunning_historicalproviderevent" not in connection.introspection.table_names()


def test_a_redelivery_reads_the_event_once_and_keeps_its_request(db, django_assert_max_num_queries):
    body = event_body("evt_again", "invoice.paid")
    assert deliver(body).status_code == 200
    with django_assert_max_num_queries(3):  # the refused insert, the event's outcome, the raw request
        second = deliver(body)
    assert second.status_code == 200 and second.json()["duplicate"] is True
    event = ProviderEvent.objects.get(event_id="evt_again")
    assert list(WebhookDelivery.objects.filter(claimed_event_id="evt_again").order_by("pk")
                .values_list("event_id", "duplicate")) == [(event.pk, False), (event.pk, True)]


def test_with_the_broker_down_the_event_is_stored_and_left_for_the_inbox_sweep(
        db, caplog, django_capture_on_commit_callbacks):
    body = event_body("evt_down", "invoice.paid")
    with tasks_through(DOWN_BROKER), caplog.at_level(logging.ERROR, logger="dunning.handoff"):
        assert redis_push(process_provider_event) is not None, "the direct push is what is under test"
        with django_capture_on_commit_callbacks(execute=True) as handed_off:
            response = deliver(body)
    assert response.status_code == 200, "the provider is answered: the event is safe"
    assert len(handed_off) == 1
    event = ProviderEvent.objects.get(event_id="evt_down")
    assert event.outcome == EventOutcome.PENDING and event.processed_at is None
    assert f"event {event.pk} stored but not handed to a worker; the inbox sweep will pick it up" in caplog.text


def test_the_direct_push_sends_what_celery_sends():
    """Both messages on a queue of this test's own, compared field by field: the worker cannot tell
    them apart (a Celery or kombu upgrade that changes its message fails here)."""
    queue = f"test-handoff-{uuid.uuid4().hex}"
    client = redis.Redis.from_url(REDIS_URL)
    try:
        with tasks_through(REDIS_URL):
            push = redis_push(process_provider_event)
            assert push is not None and push.queue == "celery"
            dataclasses.replace(push, queue=queue).send(4711)
            process_provider_event.apply_async((4711,), queue=queue)
        ours, celerys = (json.loads(client.rpop(queue)) for _ in range(2))
        assert client.llen(queue) == 0
    finally:
        client.delete(queue, *client.keys(f"_kombu.binding*.{queue}"))
    for message in (ours, celerys):
        headers, properties = message["headers"], message["properties"]
        task_id = headers.pop("id")
        assert uuid.UUID(task_id) and headers.pop("root_id") == properties.pop("correlation_id") == task_id
        assert uuid.UUID(properties.pop("delivery_tag"))
        assert json.loads(base64.b64decode(message.pop("body"))) == [
            [4711], {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]
    assert ours == celerys
    assert ours["headers"]["task"] == "dunning.tasks.process_provider_event"


def test_eager_mode_and_other_brokers_go_through_delay():
    assert redis_push(process_provider_event) is None  # the suite runs tasks in process
    with tasks_through("memory://"):
        assert redis_push(process_provider_event) is None


def test_the_embedded_database_writes_the_event_and_its_request_through_the_orm(db, monkeypatch):
    """SQLite (the demo) cannot INSERT inside a CTE: the same two rows are written by the ORM, and a
    redelivery is still one event with two kept requests."""
    monkeypatch.setattr(connections["default"], "vendor", "sqlite")
    body = event_body("evt_embedded", "invoice.paid")
    with CaptureQueriesContext(connection) as captured:
        first = deliver(body)
    assert sum(q["sql"].startswith("INSERT") for q in captured.captured_queries) == 2  # no CTE: two inserts
    again = deliver(body)
    assert (first.status_code, again.status_code) == (200, 200)
    assert again.json()["duplicate"] is True
    event = ProviderEvent.objects.get(event_id="evt_embedded")
    assert list(WebhookDelivery.objects.filter(claimed_event_id="evt_embedded").values_list("event_id", flat=True)) \
        == [event.pk, event.pk]


def _reused(db_connection) -> None:
    """The state a persistent connection is in at the start of a request (request_started's
    close_old_connections marks it unchecked; the test client leaves that signal out)."""
    db_connection.ensure_connection()
    db_connection.health_check_done = False


@pytest.mark.django_db(transaction=True)
def test_a_quiet_reused_connection_is_not_asked_select_1(monkeypatch):
    db_connection = connections["default"]
    _reused(db_connection)
    asked: list[bool] = []
    monkeypatch.setattr(db_connection, "is_usable", lambda: asked.append(True) or True)
    assert deliver(event_body("evt_quiet", "invoice.paid")).status_code == 200
    assert asked == [], "Django's health check (SELECT 1) was sent"
    assert db_connection.health_check_done
    assert ProviderEvent.objects.filter(event_id="evt_quiet").exists()


@pytest.mark.django_db(transaction=True)
def test_a_connection_the_server_closed_is_replaced_before_the_delivery_is_written():
    """The backend is terminated between two requests (as by a restart): the next delivery still
    gets its 200 and is stored, on a new connection."""
    db_connection = connections["default"]
    _reused(db_connection)
    pid = db_connection.connection.info.backend_pid
    settings_dict = db_connection.get_connection_params()
    with psycopg.connect(**settings_dict, autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
    deadline = time.monotonic() + 5
    socket = db_connection.connection.pgconn.socket
    while not select.select([socket], [], [], 0.05)[0] and time.monotonic() < deadline:
        pass  # the server's FATAL notice is on its way
    response = deliver(event_body("evt_after_restart", "invoice.paid"))
    assert response.status_code == 200
    assert db_connection.connection.info.backend_pid != pid
    assert WebhookDelivery.objects.filter(claimed_event_id="evt_after_restart", http_status=200).exists()
