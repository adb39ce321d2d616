"""The outbox's webhook consumer: each change of a tenant's intent is POSTed, signed, to the
tenant's callback URL once; a failure is retried by the next relay run and blocks no other
consumer; a tenant without a URL gets nothing."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import socket
import time
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.urls import reverse

from agentpay.bridge import trusted_now
from agentpay.models import OutboxMessage, PaymentIntent, TenantWebhookEndpoint, WebhookAttempt, WebhookDelivery
from agentpay.models.append_only import AppendOnlyViolation
from agentpay.services import outbox
from agentpay.services.outbox import outbox_relay
from agentpay.services.webhooks import WebhookRefused, tenant_webhook_configure
from tests.agentpay.webhook_receiver import Receiver

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def loopback_receivers_allowed(settings):
    """The receiver here is on loopback, which production refuses (see the tests at the end)."""
    settings.AGENTPAY_WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True


@pytest.fixture
def receiver():
    server = Receiver().start()
    yield server
    server.stop()


@pytest.fixture
def hooked(funded, receiver):
    endpoint, secret = tenant_webhook_configure(tenant=funded, url=receiver.url)
    return endpoint, secret


def verify(secret: str, request: dict) -> dict:
    """What a tenant's receiver does: check the signature over `<t>.<body>`, then read the event."""
    parts = dict(p.split("=", 1) for p in request["headers"]["AgentPay-Signature"].split(","))
    expected = hmac.new(secret.encode(), parts["t"].encode() + b"." + request["body"], hashlib.sha256).hexdigest()
    assert hmac.compare_digest(expected, parts["v1"]), "bad signature"
    return json.loads(request["body"])


def later(seconds: int = 61):
    return trusted_now() + timedelta(seconds=seconds)


def test_each_change_is_posted_signed_once(funded, routes, call, receiver, hooked):
    _, secret = hooked
    response = call("ok")
    rows = OutboxMessage.objects.filter(intent__intent_id=response["AgentPay-Intent"]).order_by("pk")
    assert outbox_relay(now=trusted_now()).published == rows.count() >= 2
    events = [verify(secret, r) for r in receiver.received]
    assert [e["id"] for e in events] == [r.dedupe_key for r in rows]
    assert [r["headers"]["AgentPay-Event-Id"] for r in receiver.received] == [r.dedupe_key for r in rows]
    assert events[-1]["data"]["display_status"] == "COMPLETED"
    assert events[-1]["data"]["request_id"] == response["X-Request-Id"]
    assert WebhookDelivery.objects.filter(delivered_at__isnull=False, last_status=200).count() == rows.count()
    assert WebhookAttempt.objects.count() == rows.count()
    # A forged body does not verify with the tenant's secret.
    forged = {**receiver.received[0], "body": receiver.received[0]["body"].replace(b"COMPLETED", b"FAILED") + b" "}
    with pytest.raises(AssertionError, match="bad signature"):
        verify(secret, forged)


def test_a_second_publish_of_the_same_row_sends_nothing(funded, routes, call, receiver, hooked):
    call("ok")
    outbox_relay(now=trusted_now())
    sent = len(receiver.received)
    # At least once: the relay may publish a row again (e.g. it died before marking it published).
    OutboxMessage.objects.update(published_at=None)
    assert outbox_relay(now=later()).published == sent
    assert len(receiver.received) == sent
    assert WebhookDelivery.objects.count() == sent and WebhookAttempt.objects.count() == sent


def test_a_500_is_retried_on_the_next_run_and_blocks_no_other_consumer(funded, routes, call, receiver, hooked,
                                                                       caplog, monkeypatch):
    # The webhook first: the log line after it must still be written while the webhook fails.
    monkeypatch.setitem(outbox.CONSUMERS, "agentpay.intent.changed", [outbox.webhook_deliver,
                                                                      outbox.log_intent_changed])
    call("ok")
    count = OutboxMessage.objects.count()
    receiver.status = 500
    with caplog.at_level(logging.INFO, logger="agentpay.events"):
        first = outbox_relay(now=trusted_now())
    assert (first.published, first.failed) == (0, count)
    assert len([r for r in caplog.records if r.name == "agentpay.events"]) == count
    row = OutboxMessage.objects.order_by("pk").first()
    assert row.published_at is None and "HTTP 500" in row.last_error
    delivery = WebhookDelivery.objects.get(message=row)
    assert (delivery.delivered_at, delivery.attempts, delivery.last_status) == (None, 1, 500)
    assert all("webhook_deliver: deferred" in later_row.last_error
               for later_row in OutboxMessage.objects.order_by("pk")[1:])
    receiver.status = 200
    assert outbox_relay(now=later()).published == count
    delivery.refresh_from_db()
    assert delivery.delivered_at is not None and delivery.attempts == 2
    assert list(WebhookAttempt.objects.filter(delivery=delivery).order_by("pk").values_list("http_status", flat=True)
                ) == [500, 200]
    # The first row was refused and the tenant's later rows deferred unsent in that run; then each
    # was taken once.
    assert len(receiver.received) == count + 1
    assert outbox_relay(now=later(122)).published == 0


def test_an_unreachable_receiver_leaves_the_row_with_the_error(funded, routes, call):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/hook"
    tenant_webhook_configure(tenant=funded, url=url)
    call("ok")
    assert outbox_relay(now=trusted_now()).published == 0
    attempt = WebhookAttempt.objects.order_by("pk").first()
    assert attempt.http_status is None and "Connection" in attempt.error
    assert not OutboxMessage.objects.filter(published_at__isnull=False).exists()


def test_a_tenant_without_a_callback_url_gets_nothing_and_nothing_is_recorded(funded, routes, call, receiver):
    call("ok")
    assert outbox_relay(now=trusted_now()).failed == 0
    assert not OutboxMessage.objects.filter(published_at__isnull=True).exists()
    assert WebhookDelivery.objects.count() == 0 and receiver.received == []


def test_the_secret_is_shown_once_and_not_stored(funded, receiver):
    endpoint, secret = tenant_webhook_configure(tenant=funded, url=receiver.url)
    assert secret.startswith("whsec_ap_")
    stored = TenantWebhookEndpoint.objects.filter(pk=endpoint.pk).values().get()
    assert secret not in json.dumps(stored, default=str)
    same, none = tenant_webhook_configure(tenant=funded, url=receiver.url + "/v2")
    assert none is None and same.pk == endpoint.pk
    _, rotated = tenant_webhook_configure(tenant=funded, url=receiver.url, rotate_secret=True)
    assert rotated and rotated != secret
    with pytest.raises(WebhookRefused):
        tenant_webhook_configure(tenant=funded, url="file:///etc/passwd")


def test_attempts_cannot_be_rewritten(funded, routes, call, receiver, hooked):
    call("ok")
    outbox_relay(now=trusted_now())
    attempt = WebhookAttempt.objects.first()
    with pytest.raises(AppendOnlyViolation):
        WebhookAttempt.objects.filter(pk=attempt.pk).update(http_status=500)
    with pytest.raises(AppendOnlyViolation):
        WebhookDelivery.objects.filter(pk=attempt.delivery_id).update(url="http://elsewhere.invalid/")
    with pytest.raises(Exception, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE agentpay_webhookattempt SET http_status = 500")


def test_the_intent_timeline_shows_the_posts_and_the_command_sets_the_url(funded, routes, call, receiver, lead,
                                                                         client):
    out = StringIO()
    call_command("agentpay_tenant_webhook", funded.tenant_id, receiver.url, stdout=out, stderr=StringIO())
    assert "whsec_ap_" in out.getvalue()
    intent_id = call("ok")["AgentPay-Intent"]
    outbox_relay(now=trusted_now())
    client.force_login(lead)
    pk = PaymentIntent.objects.get(intent_id=intent_id).pk
    page = client.get(reverse("admin:agentpay_paymentintent_change", args=[pk])).content.decode()
    assert page.count("ap-kind ap-kind-webhook") == WebhookAttempt.objects.count() >= 2


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/hook", "http://localhost/hook", "http://10.1.2.3/hook",
                                 "http://169.254.169.254/latest/meta-data/", "http://[::1]/hook",
                                 "http://[::ffff:192.168.0.1]/hook", "http://0.0.0.0/hook",
                                 "https://no-such-host.invalid/hook"])
def test_a_callback_url_on_a_non_public_address_is_refused(funded, settings, url):
    settings.AGENTPAY_WEBHOOK_ALLOW_PRIVATE_ADDRESSES = False
    with pytest.raises(WebhookRefused) as refused:
        tenant_webhook_configure(tenant=funded, url=url)
    assert "public addresses only" in str(refused.value)
    assert not TenantWebhookEndpoint.objects.filter(tenant=funded).exists()


def test_a_host_that_turns_private_after_it_was_set_gets_nothing(funded, routes, call, receiver, hooked, settings):
    """DNS rebinding, or a deployment that stops allowing private receivers: the connection's
    peer is checked again, and nothing is POSTed to it."""
    settings.AGENTPAY_WEBHOOK_ALLOW_PRIVATE_ADDRESSES = False
    call("ok")
    assert outbox_relay(now=trusted_now()).published == 0
    attempt = WebhookAttempt.objects.order_by("pk").first()
    assert attempt.http_status is None and "non-public address 127.0.0.1" in attempt.error
    assert receiver.received == []


def test_a_receiver_that_never_answers_costs_one_timeout_per_run(funded, routes, call, settings):
    """A tenant endpoint that accepts the connection and never answers: the first row waits for
    the timeout, the tenant's later rows in the same run are deferred unsent (in order, for the
    next run), and the run ends in about one timeout instead of one per row."""
    settings.AGENTPAY_WEBHOOK_TIMEOUT_SECONDS = 0.5
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # the kernel accepts; nobody ever reads or answers
        tenant_webhook_configure(tenant=funded, url=f"http://127.0.0.1:{silent.getsockname()[1]}/hook")
        call("ok", "k-a")
        call("ok", "k-b")
        rows = OutboxMessage.objects.filter(published_at__isnull=True).count()
        assert rows >= 4
        started = time.monotonic()
        run = outbox_relay(now=trusted_now())
        took = time.monotonic() - started
    assert (run.published, run.failed) == (0, rows)
    assert WebhookAttempt.objects.count() == 1 and "timed out" in WebhookAttempt.objects.get().error
    assert took < 0.5 * 3, f"{took:.2f} s: the dead receiver was tried more than once"
    deferred = OutboxMessage.objects.exclude(pk=WebhookAttempt.objects.get().delivery.message_id)
    assert all("deferred" in m.last_error for m in deferred), [m.last_error for m in deferred]
