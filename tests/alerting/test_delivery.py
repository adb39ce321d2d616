"""Alerts reach a person (issue 19 item 2): an email to the on-call list and a signed,
Slack-compatible webhook per new alert episode, sent only after commit, once per episode and
channel, a failed webhook retried with bounded back-off and every try recorded."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.core import mail
from django.db import transaction

from dunning.actions import alert_delivery
from dunning.actions.alert_messages import signature_verify
from dunning.actions.alerts import alert_raise, alert_resolve
from dunning.jobs.framework import job_run
from dunning.models import ALERT_RAISED_TOPIC, Alert, AlertDelivery, AlertKind, OutboxMessage
from tests.alerting.conftest import ONCALL, WEBHOOK_SECRET
from tests.support.threads import run_together

pytestmark = pytest.mark.django_db(transaction=True)
NOON = datetime(2030, 3, 10, 12, 0, tzinfo=UTC)


@pytest.fixture
def clock():
    with time_machine.travel(NOON, tick=True) as traveller:
        yield traveller


def raise_alert(key: str = "paid_not_restored:in_1", kind: str = AlertKind.PAID_NOT_RESTORED, *, now=None) -> Alert:
    return alert_raise(kind=kind, dedupe_key=key, detail="Invoice in_1 was paid 3 min ago; access is still SUSPENDED",
                       figures={"seconds_since_paid": 180}, now=now or datetime.now(UTC))


def deliveries(alert: Alert) -> dict[str, AlertDelivery]:
    return {d.channel: d for d in AlertDelivery.objects.filter(alert=alert)}


def test_a_new_episode_is_emailed_to_on_call_and_posted_as_a_signed_slack_message(alert_channels, clock):
    alert = raise_alert()
    case_url = f"https://billing.example.com/admin/dunning/alert/{alert.pk}/change/"

    assert len(mail.outbox) == 1
    email = mail.outbox[0]
    assert sorted(email.to) == sorted(ONCALL)
    assert "Paid but access not restored" in email.subject
    assert case_url in email.body and "SUSPENDED" in email.body

    assert len(alert_channels.received) == 1
    request = alert_channels.received[0]
    assert request.path == "/hooks/T000/B000/secretpath"
    # The receiver's own check, independent of the product's helper.
    parts = dict(p.split("=", 1) for p in request.headers["dunning-signature"].split(","))
    expected = hmac.new(WEBHOOK_SECRET.encode(), f"{parts['t']}.".encode() + request.body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(parts["v1"], expected)
    assert abs(int(parts["t"]) - NOON.timestamp()) < 60
    assert signature_verify(header=request.headers["dunning-signature"], body=request.body, secret=WEBHOOK_SECRET,
                            now=datetime.now(UTC))
    assert not signature_verify(header=request.headers["dunning-signature"], body=request.body + b" ",
                                secret=WEBHOOK_SECRET, now=datetime.now(UTC))
    assert request.headers["dunning-message-id"] == f"{ALERT_RAISED_TOPIC}:{alert.pk}"
    body = json.loads(request.body)
    assert "Paid but access not restored" in body["text"] and case_url in body["text"]
    types = [block["type"] for block in body["blocks"]]
    assert types[0] == "header" and "actions" in types
    button = next(b for b in body["blocks"] if b["type"] == "actions")["elements"][0]
    assert button["url"] == case_url

    sent = deliveries(alert)
    assert {c: (d.status, d.attempts) for c, d in sent.items()} == {"EMAIL": ("SENT", 1), "WEBHOOK": ("SENT", 1)}
    assert sent["WEBHOOK"].last_status_code == 200
    assert sent["WEBHOOK"].target == f"{alert_channels.url.split('/hooks')[0]}/…"  # the secret path is not stored
    assert OutboxMessage.objects.get(topic=ALERT_RAISED_TOPIC).published_at is not None


def test_the_same_open_episode_sends_nothing_again_and_a_new_episode_sends_again(alert_channels, clock):
    first = raise_alert()
    again = raise_alert()
    assert again.pk == first.pk and again.occurrences == 2
    assert len(mail.outbox) == 1 and len(alert_channels.received) == 1
    assert OutboxMessage.objects.filter(topic=ALERT_RAISED_TOPIC).count() == 1

    # Delivering the same message again (the relay after the task) sends nothing either.
    assert alert_delivery.alert_message_handle(message_pk=OutboxMessage.objects.get().pk) == {}
    assert job_run("outbox_relay").status == "OK"
    assert len(mail.outbox) == 1 and len(alert_channels.received) == 1

    alert_resolve(first, by="job:alerts", now=datetime.now(UTC))
    second = raise_alert()
    assert second.pk != first.pk and second.dedupe_key.endswith("#2")
    assert len(mail.outbox) == 2 and len(alert_channels.received) == 2
    assert AlertDelivery.objects.count() == 4
    assert {d.status for d in deliveries(second).values()} == {"SENT"}


def test_nothing_is_sent_before_commit_and_a_rollback_sends_nothing(alert_channels, clock):
    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        raise_alert("paid_not_restored:in_rolled_back")
        assert OutboxMessage.objects.filter(topic=ALERT_RAISED_TOPIC).count() == 1  # written with the alert
        assert mail.outbox == [] and alert_channels.received == []
        raise Abort
    assert not Alert.objects.exists() and not OutboxMessage.objects.exists() and not AlertDelivery.objects.exists()
    assert mail.outbox == [] and alert_channels.received == []

    with transaction.atomic():
        raise_alert("paid_not_restored:in_committed")
        assert mail.outbox == [] and alert_channels.received == []  # still inside the transaction
    assert len(mail.outbox) == 1 and len(alert_channels.received) == 1


def test_a_failing_webhook_is_retried_with_back_off_then_recorded_as_failed(alert_channels, clock, settings):
    settings.ALERT_DELIVERY_MAX_ATTEMPTS = 3
    alert_channels.answers = [500, 503, 502]
    alert = raise_alert()
    webhook = deliveries(alert)["WEBHOOK"]
    assert (webhook.status, webhook.attempts, webhook.last_status_code) == ("RETRYING", 1, 500)
    assert webhook.next_attempt_at == webhook.last_attempt_at + timedelta(seconds=30)
    assert deliveries(alert)["EMAIL"].status == "SENT"  # one channel's failure never holds the other

    clock.shift(timedelta(seconds=10))
    job_run("alert_deliveries")
    assert len(alert_channels.received) == 1  # not due yet

    clock.shift(timedelta(seconds=25))
    job_run("alert_deliveries")
    webhook.refresh_from_db()
    assert (webhook.status, webhook.attempts, webhook.last_status_code) == ("RETRYING", 2, 503)
    assert webhook.next_attempt_at == webhook.last_attempt_at + timedelta(seconds=60)

    clock.shift(timedelta(seconds=61))
    job_run("alert_deliveries")
    webhook.refresh_from_db()
    assert (webhook.status, webhook.attempts, webhook.last_status_code) == ("FAILED", 3, 502)
    assert "HTTP 502" in webhook.last_error and webhook.next_attempt_at is None

    clock.shift(timedelta(hours=2))
    job_run("alert_deliveries")
    assert len(alert_channels.received) == 3  # bounded: no fourth try
    tries = list(webhook.tries.order_by("number").values_list("number", "outcome", "status_code"))
    assert tries == [(1, "RETRY", 500), (2, "RETRY", 503), (3, "FAILED", 502)]
    assert len(mail.outbox) == 1


def test_a_permanent_refusal_is_not_retried_and_an_unreachable_receiver_is_recorded(alert_channels, clock, settings):
    alert_channels.answers = [404]
    refused = raise_alert("k:refused", AlertKind.DUPLICATE_CHARGE)
    webhook = deliveries(refused)["WEBHOOK"]
    assert (webhook.status, webhook.attempts, webhook.last_status_code) == ("FAILED", 1, 404)

    settings.ALERT_WEBHOOK_URL = "http://127.0.0.1:9/closed"
    unreachable = deliveries(raise_alert("k:unreachable", AlertKind.DUPLICATE_CHARGE))["WEBHOOK"]
    assert unreachable.status == "RETRYING" and unreachable.last_status_code is None
    assert "URLError" in unreachable.last_error or "Connection" in unreachable.last_error


def test_an_episode_resolved_before_its_retry_is_not_sent_again(alert_channels, clock):
    alert_channels.answers = [500, 200]
    alert = raise_alert()
    alert_resolve(alert, by="job:alerts", now=datetime.now(UTC))
    clock.shift(timedelta(seconds=31))
    job_run("alert_deliveries")
    webhook = deliveries(alert)["WEBHOOK"]
    assert webhook.status == "SKIPPED" and "resolved by job:alerts" in webhook.last_error
    assert len(alert_channels.received) == 1


def test_unconfigured_channels_are_recorded_as_not_sent_and_an_unsigned_webhook_is_refused(settings, clock):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.ALERT_ONCALL_EMAILS = []
    settings.ALERT_WEBHOOK_URL = ""
    alert = raise_alert()
    assert {c: (d.status, d.last_error) for c, d in deliveries(alert).items()} == {
        "EMAIL": ("SKIPPED", "ALERT_ONCALL_EMAILS is empty"), "WEBHOOK": ("SKIPPED", "ALERT_WEBHOOK_URL is not set")}

    settings.ALERT_WEBHOOK_URL, settings.ALERT_WEBHOOK_SECRET = "http://127.0.0.1:9/x", ""
    webhook = deliveries(raise_alert("k:unsigned", AlertKind.DUPLICATE_CHARGE))["WEBHOOK"]
    assert webhook.status == "FAILED" and "unsigned" in webhook.last_error and webhook.attempts == 0
    assert mail.outbox == []


class BrokerDown:
    @staticmethod
    def delay(message_pk: int) -> None:
        raise ConnectionError("broker unreachable")


@pytest.fixture
def broker_down():
    previous = alert_delivery.ALERT_HANDOFF.task
    alert_delivery.alert_delivery_worker_set(BrokerDown)
    yield
    alert_delivery.alert_delivery_worker_set(previous)


def test_a_lost_hand_off_is_delivered_by_the_outbox_relay(alert_channels, clock, broker_down):
    alert = raise_alert()
    assert mail.outbox == [] and alert_channels.received == [] and not AlertDelivery.objects.exists()

    assert job_run("outbox_relay").status == "OK"
    assert len(mail.outbox) == 1 and len(alert_channels.received) == 1
    assert {d.status for d in deliveries(alert).values()} == {"SENT"}


def test_a_try_a_dead_worker_left_half_done_counts_and_is_recorded(alert_channels, clock, settings):
    alert_channels.answers = [500, 200]
    alert = raise_alert()
    webhook = deliveries(alert)["WEBHOOK"]
    # As a worker killed during its second try leaves it: counted, SENDING, nobody holding its claim.
    AlertDelivery.objects.filter(pk=webhook.pk).update(status="SENDING", attempts=2)
    clock.shift(timedelta(seconds=31))
    job_run("alert_deliveries")
    webhook.refresh_from_db()
    assert (webhook.status, webhook.attempts) == ("SENT", 3)
    outcomes = list(webhook.tries.order_by("number").values_list("number", "outcome"))
    assert outcomes == [(1, "RETRY"), (2, "RETRY"), (3, "SENT")]
    assert "worker stopped" in webhook.tries.get(number=2).error


def test_the_deliveries_list_finds_the_failed_ones(alert_channels, clock, admin_client):
    alert_channels.answers = [404]
    alert = raise_alert("k:listed", AlertKind.DUPLICATE_CHARGE)
    raise_alert("k:fine", AlertKind.DUPLICATE_CHARGE)  # answered 404 too: the receiver repeats its last answer
    alert_channels.answers = [200]
    sent = raise_alert("k:sent", AlertKind.DUPLICATE_CHARGE)
    failed = admin_client.get("/admin/dunning/alertdelivery/?status__exact=FAILED").content.decode()
    assert "k:listed" in failed and "k:fine" in failed and "k:sent" not in failed
    webhook = deliveries(alert)["WEBHOOK"]
    page = admin_client.get(f"/admin/dunning/alertdelivery/{webhook.pk}/change/")
    assert page.status_code == 200 and "HTTP 404" in page.content.decode()
    assert deliveries(sent)["WEBHOOK"].status == "SENT"


@pytest.mark.race
def test_two_workers_delivering_one_message_at_once_send_it_once(alert_channels, clock, broker_down):
    raise_alert()
    message = OutboxMessage.objects.get(topic=ALERT_RAISED_TOPIC)
    run_together([lambda: alert_delivery.alert_message_handle(message_pk=message.pk),
                  lambda: alert_delivery.alert_message_deliver(OutboxMessage.objects.get(pk=message.pk),
                                                               now=datetime.now(UTC))])
    assert len(mail.outbox) == 1 and len(alert_channels.received) == 1
    assert sorted(AlertDelivery.objects.values_list("channel", "status", "attempts")) == [
        ("EMAIL", "SENT", 1), ("WEBHOOK", "SENT", 1)]
