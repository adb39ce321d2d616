"""Entitlement pushes: signed, one delivery per (message, subscriber), a failing subscriber
retried with back-off while the others got it once; the reference consumer verifies the
signature and ignores stale generations and replayed messages."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest

from dunning.jobs.framework import job_run
from dunning.models import OutboxMessage
from entitlements.models import EntitlementDelivery, EntitlementSubscriber
from entitlements.push import push_body, push_signature
from entitlements.reference_consumer import APPLIED, DUPLICATE, STALE, ReferenceConsumer, SignatureError

SECRET = "whsec_push_test"


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass


@contextmanager
def serve(app) -> Iterator[str]:
    """A tiny HTTP server on loopback in a thread; yields its URL."""
    server = make_server("127.0.0.1", 0, app, handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/hooks/entitlements"
    finally:
        server.shutdown()
        server.server_close()


class FailingSubscriber:
    def __init__(self):
        self.hits = 0

    def __call__(self, environ, start_response):
        self.hits += 1
        start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
        return [b"down"]


def _messages():
    return list(OutboxMessage.objects.filter(topic="entitlement.changed").order_by("created_at", "pk"))


def test_a_failing_subscriber_is_retried_with_backoff_while_the_other_got_each_push_once(grace_cycle):
    consumer = ReferenceConsumer(secret=SECRET)
    failing = FailingSubscriber()
    with serve(consumer.wsgi_app) as good_url, serve(failing) as bad_url:
        good = EntitlementSubscriber.objects.create(name="runtime", url=good_url, secret=SECRET)
        bad = EntitlementSubscriber.objects.create(name="flaky", url=bad_url, secret="other")
        t0 = job_run("outbox_relay").run_for
        messages = _messages()
        assert [m.payload["generation"] for m in messages] == [1, 2]
        assert all(m.published_at for m in messages)  # relayed whatever a subscriber answered
        held = consumer.entitlement(grace_cycle.subscription_id)
        assert (held["generation"], held["profile"]) == (2, "READ_EXPORT_NO_NEW_JOBS")
        assert [outcome for _, outcome in consumer.log] == [APPLIED, APPLIED]
        assert failing.hits == 2
        assert set(EntitlementDelivery.objects.filter(subscriber=good).values_list("status", "attempts")) == {
            ("DELIVERED", 1)}
        failed = list(EntitlementDelivery.objects.filter(subscriber=bad).order_by("pk"))
        assert [(d.status, d.attempts, d.last_status_code) for d in failed] == [("PENDING", 1, 503)] * 2
        assert [d.next_attempt_at - t0 for d in failed] == [timedelta(seconds=30)] * 2

        assert job_run("entitlement_push", now=t0 + timedelta(seconds=10)).examined == 0  # not due yet
        t1 = t0 + timedelta(seconds=31)
        run = job_run("entitlement_push", now=t1)
        assert (run.examined, run.errors) == (2, 2)
        assert failing.hits == 4
        failed = list(EntitlementDelivery.objects.filter(subscriber=bad).order_by("pk"))
        assert [(d.attempts, d.next_attempt_at - t1) for d in failed] == [(2, timedelta(seconds=60))] * 2
        t2 = t1 + timedelta(seconds=61)
        job_run("entitlement_push", now=t2)
        failed = list(EntitlementDelivery.objects.filter(subscriber=bad).order_by("pk"))
        assert [(d.attempts, d.next_attempt_at - t2) for d in failed] == [(3, timedelta(seconds=120))] * 2
        assert len(consumer.log) == 2  # the healthy subscriber never got a resend


def test_a_subscriber_that_recovers_gets_the_push_on_retry(grace_cycle):
    consumer = ReferenceConsumer(secret=SECRET)
    with serve(consumer.wsgi_app) as url:
        subscriber = EntitlementSubscriber.objects.create(name="late", url="http://127.0.0.1:9/closed", secret=SECRET)
        t0 = job_run("outbox_relay").run_for
        assert set(EntitlementDelivery.objects.values_list("status", "last_status_code")) == {("PENDING", None)}
        EntitlementSubscriber.objects.filter(pk=subscriber.pk).update(url=url)
        job_run("entitlement_push", now=t0 + timedelta(seconds=31))
    assert set(EntitlementDelivery.objects.values_list("status", "attempts")) == {("DELIVERED", 2)}
    assert consumer.entitlement(grace_cycle.subscription_id)["generation"] == 2


def test_subscribers_of_another_cohort_and_inactive_ones_get_nothing(grace_cycle):
    EntitlementSubscriber.objects.create(name="beta-only", url="http://127.0.0.1:9/x", secret=SECRET, cohort="beta")
    EntitlementSubscriber.objects.create(name="off", url="http://127.0.0.1:9/y", secret=SECRET, active=False)
    job_run("outbox_relay")
    assert not EntitlementDelivery.objects.exists()


def _signed(message: OutboxMessage, *, secret: str = SECRET, at: float | None = None) -> tuple[bytes, str]:
    body = push_body(message)
    return body, push_signature(secret, int(at if at is not None else time.time()), body)


def test_the_reference_consumer_ignores_a_lower_generation(grace_cycle):
    first, second = _messages()
    consumer = ReferenceConsumer(secret=SECRET)
    assert consumer.receive(*_signed(second)) == APPLIED
    assert consumer.receive(*_signed(first)) == STALE  # arrived late: generation 1 < 2
    assert consumer.entitlement(grace_cycle.subscription_id)["generation"] == 2


def test_the_reference_consumer_ignores_a_replayed_message(grace_cycle):
    _, second = _messages()
    consumer = ReferenceConsumer(secret=SECRET)
    body, signature = _signed(second)
    assert consumer.receive(body, signature) == APPLIED
    assert consumer.receive(*_signed(second)) == DUPLICATE  # a redelivery, freshly signed
    assert json.loads(body)["id"] == second.dedupe_key


@pytest.mark.parametrize("tamper", ["wrong secret", "changed body", "old timestamp", "no header"])
def test_the_reference_consumer_rejects_a_bad_signature(grace_cycle, tamper):
    _, message = _messages()
    consumer = ReferenceConsumer(secret=SECRET)
    body, signature = _signed(message, secret="whsec_attacker" if tamper == "wrong secret" else SECRET,
                              at=time.time() - 3600 if tamper == "old timestamp" else None)
    if tamper == "changed body":
        body = body.replace(b'"READ_EXPORT_NO_NEW_JOBS"', b'"FULL"')
    if tamper == "no header":
        signature = ""
    with pytest.raises(SignatureError):
        consumer.receive(body, signature)
    assert consumer.entitlement(grace_cycle.subscription_id) is None


def test_the_reference_consumer_answers_400_to_a_bad_signature_over_http(grace_cycle):
    import urllib.error
    import urllib.request

    _, message = _messages()
    consumer = ReferenceConsumer(secret=SECRET)
    body, _ = _signed(message)
    with serve(consumer.wsgi_app) as url:
        request = urllib.request.Request(url, data=body, method="POST",
                                         headers={"Dunning-Signature": f"t={int(time.time())},v1={'0' * 64}"})
        with pytest.raises(urllib.error.HTTPError) as error:
            urllib.request.urlopen(request, timeout=3)
    assert error.value.code == 400
    assert consumer.entitlement(grace_cycle.subscription_id) is None
