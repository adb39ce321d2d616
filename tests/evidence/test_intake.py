"""POST /webhooks/stripe/: verified, deduplicated, handed off; the raw request is kept whatever happens."""

from __future__ import annotations

import time

import pytest
from django.test import Client

from dunning.models import EventOutcome, ProviderEvent, WebhookDelivery
from tests.support.signing import event_body, stripe_signature
from tests.support.threads import run_together

URL = "/webhooks/stripe/"
SECRET = "whsec_local"


def post(client, body: bytes, signature: str | None):
    headers = {"HTTP_STRIPE_SIGNATURE": signature} if signature is not None else {}
    return client.post(URL, data=body, content_type="application/json", **headers)


@pytest.fixture(autouse=True)
def webhook_settings(settings):
    settings.STRIPE_WEBHOOK_SECRETS = [SECRET]
    settings.STRIPE_ACCOUNT = "acct_demo"
    settings.WEBHOOK_MAX_BODY_BYTES = 64 * 1024


def test_verified_event_is_stored_once_and_duplicates_answer_200(db, client, django_capture_on_commit_callbacks):
    body = event_body("evt_dup", "customer.created")
    with django_capture_on_commit_callbacks() as handed_off:
        first = post(client, body, stripe_signature(body, SECRET))
        second = post(client, body, stripe_signature(body, SECRET))
    assert len(handed_off) == 1, "only the first delivery hands the event to a worker"
    assert first.status_code == second.status_code == 200
    assert first.json()["duplicate"] is False and second.json()["duplicate"] is True
    assert ProviderEvent.objects.filter(event_id="evt_dup").count() == 1
    assert WebhookDelivery.objects.filter(claimed_event_id="evt_dup").count() == 2
    assert WebhookDelivery.objects.filter(claimed_event_id="evt_dup", duplicate=True).count() == 1


def test_unknown_event_type_is_recorded_as_ignored(db, client, django_capture_on_commit_callbacks):
    body = event_body("evt_ignored", "customer.created")
    with django_capture_on_commit_callbacks(execute=True) as handed_off:
        assert post(client, body, stripe_signature(body, SECRET)).status_code == 200
    assert len(handed_off) == 1
    event = ProviderEvent.objects.get(event_id="evt_ignored")
    assert event.outcome == EventOutcome.IGNORED and event.processed_at is not None
    assert "not used for dunning" in event.outcome_detail


def test_unknown_account_is_quarantined_without_any_access_change(db, client, django_capture_on_commit_callbacks):
    body = event_body("evt_acct", "invoice.payment_failed", account="acct_somebody_else")
    with django_capture_on_commit_callbacks(execute=True):
        assert post(client, body, stripe_signature(body, SECRET)).status_code == 200
    event = ProviderEvent.objects.get(event_id="evt_acct")
    assert event.outcome == EventOutcome.QUARANTINED and "acct_somebody_else" in event.outcome_detail


def test_secret_rolling_accepts_either_signature(db, client, settings):
    settings.STRIPE_WEBHOOK_SECRETS = ["whsec_old", "whsec_new"]
    body = event_body("evt_roll", "customer.created")
    ts = int(time.time())
    both = f"{stripe_signature(body, 'whsec_old', timestamp=ts)},v1=" + \
        stripe_signature(body, "whsec_new", timestamp=ts).split("v1=")[1]
    assert post(client, body, both).status_code == 200
    body2 = event_body("evt_roll2", "customer.created")
    assert post(client, body2, stripe_signature(body2, "whsec_new")).status_code == 200


@pytest.mark.parametrize("case,status,code", [
    ("tampered body", 400, "SIGNATURE_MISMATCH"),
    ("wrong secret", 400, "SIGNATURE_MISMATCH"),
    ("v0 only", 400, "NO_V1_SIGNATURE"),
    ("old timestamp", 400, "TIMESTAMP_TOO_OLD"),
    ("future timestamp", 400, "TIMESTAMP_IN_FUTURE"),
    ("no header", 400, "SIGNATURE_MISSING"),
    ("garbage header", 400, "SIGNATURE_MALFORMED"),
    ("malformed json", 400, "MALFORMED_PAYLOAD"),
    ("not an event", 400, "MALFORMED_EVENT"),
    ("signed json array", 400, "MALFORMED_PAYLOAD"),
    ("oversized", 413, "BODY_TOO_LARGE"),
])
def test_bad_input_gets_a_clear_4xx_and_the_raw_request_is_kept(db, client, case, status, code):
    body = event_body("evt_bad")
    signature: str | None = stripe_signature(body, SECRET)
    now = int(time.time())
    if case == "tampered body":
        body = body.replace(b"invoice.paid", b"invoice.void")
    elif case == "wrong secret":
        signature = stripe_signature(body, "whsec_wrong")
    elif case == "v0 only":
        signature = stripe_signature(body, SECRET, scheme="v0")
    elif case == "old timestamp":
        signature = stripe_signature(body, SECRET, timestamp=now - 301)
    elif case == "future timestamp":
        signature = stripe_signature(body, SECRET, timestamp=now + 301)
    elif case == "no header":
        signature = None
    elif case == "garbage header":
        signature = "nonsense"
    elif case == "malformed json":
        body = b'{"id": "evt_bad", "type": '
        signature = stripe_signature(body, SECRET)
    elif case == "signed json array":
        body = b'[{"id": "evt_bad", "object": "event"}]'
        signature = stripe_signature(body, SECRET)
    elif case == "not an event":
        body = b'{"id": "evt_bad", "object": "event"}'
        signature = stripe_signature(body, SECRET)
    elif case == "oversized":
        body = event_body("evt_big", "invoice.paid", padding="x" * 70_000)
        signature = stripe_signature(body, SECRET)
    response = post(client, body, signature)
    assert response.status_code == status
    assert response["Content-Type"] == "application/problem+json"
    problem = response.json()
    assert problem["code"] == code and problem["status"] == status and problem["type"].startswith("https://")
    delivery = WebhookDelivery.objects.get()
    assert delivery.verification == "REJECTED" and delivery.rejection_reason == code
    assert bytes(delivery.body) == body[: 64 * 1024]
    assert delivery.truncated == (case == "oversized")
    assert not ProviderEvent.objects.exists()


@pytest.mark.parametrize("breaks", ["inbox write", "verification"])
def test_a_failure_on_our_side_keeps_the_raw_request_and_tells_the_provider_to_retry(db, monkeypatch, breaks):
    from django.db import DatabaseError

    from dunning.evidence import intake as webhook_intake

    def broken(*args, **kwargs):
        raise DatabaseError("disk full") if breaks == "inbox write" else RuntimeError("SDK bug")

    if breaks == "inbox write":
        monkeypatch.setattr(webhook_intake, "_insert_new_event", broken)
    else:
        monkeypatch.setattr("subscriptions.providers.stripe_adapter.StripeProvider.verify_webhook", broken)
    body = event_body("evt_breaks", "invoice.paid")

    response = post(Client(raise_request_exception=False), body, stripe_signature(body, SECRET))

    assert response.status_code == 500, "a 5xx makes the provider deliver again"
    kept = WebhookDelivery.objects.get()
    assert bytes(kept.body) == body and kept.http_status == 500 and kept.verification == "PENDING"
    assert kept.rejection_reason == ("INBOX_WRITE_FAILED" if breaks == "inbox write" else "VERIFICATION_ERROR")
    assert ("disk full" if breaks == "inbox write" else "SDK bug") in kept.detail
    assert not ProviderEvent.objects.exists()


def test_get_is_not_allowed(db, client):
    assert client.get(URL).status_code == 405


@pytest.mark.django_db(transaction=True)
def test_parallel_deliveries_of_one_event_store_it_once():
    body = event_body("evt_parallel", "customer.created")
    signature = stripe_signature(body, SECRET)

    def deliver():
        return post(Client(), body, signature).status_code

    statuses = run_together([deliver] * 6, timeout=30)
    assert statuses == [200] * 6
    assert ProviderEvent.objects.filter(event_id="evt_parallel").count() == 1
    assert WebhookDelivery.objects.filter(claimed_event_id="evt_parallel", duplicate=False).count() == 1
