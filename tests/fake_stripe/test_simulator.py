"""The Stripe simulator, exercised through the real ``stripe`` SDK over HTTP on loopback."""

from __future__ import annotations

import functools
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import stripe

from tests.support.threads import run_together
from tests.verification.fake_stripe import InvalidTransition, StripeSimulator
from tests.verification.fake_stripe.billing import DAY

ROOT = Path(__file__).resolve().parents[2]
SECRET = "whsec_local"
LEGACY = "2024-06-20"


def make_client(base_url: str, *, version: str | None = None, timeout: float = 10.0) -> stripe.StripeClient:
    return stripe.StripeClient("sk_test_local", base_addresses={"api": base_url}, max_network_retries=0,
                               stripe_version=version, http_client=stripe.RequestsClient(timeout=timeout))


@pytest.fixture
def sim() -> Iterator[StripeSimulator]:
    simulator = StripeSimulator()
    simulator.start()
    yield simulator
    simulator.stop()


@pytest.fixture
def client(sim: StripeSimulator) -> stripe.StripeClient:
    return make_client(sim.base_url)


@pytest.fixture
def legacy_client(sim: StripeSimulator) -> stripe.StripeClient:
    return make_client(sim.base_url, version=LEGACY)


def renewal(sim: StripeSimulator, card: str = "ok", amount: int = 2500) -> tuple[str, str, str]:
    """A customer with a paid first invoice and an open renewal invoice; returns (customer, sub, invoice)."""
    cus = sim.create_customer("ada@example.com")
    sub = sim.create_subscription(cus, "price_monthly_pro", amount=2000)
    sim.set_card(cus, card)
    return cus, sub, sim.create_renewal_invoice(sub, amount=amount)


def raw_request(url: str, *, method: str = "GET", data: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, data=data, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Collector:
    """A callable webhook sink that verifies every signature and records the events in arrival order."""

    def __init__(self, status: int = 200, secret: str = SECRET) -> None:
        self.status = status
        self.secret = secret
        self.events: list[Any] = []

    def __call__(self, body: bytes, headers: dict[str, str]) -> int:
        event = stripe.Webhook.construct_event(body.decode(), headers["Stripe-Signature"], self.secret, tolerance=300)
        self.events.append(event)
        return self.status

    @property
    def ids(self) -> list[str]:
        return [e.id for e in self.events]


# ---------------------------------------------------------------- shapes


def test_retrieve_new_shape(sim: StripeSimulator, client: stripe.StripeClient) -> None:
    _, sub, inv_id = renewal(sim)
    inv = client.v1.invoices.retrieve(inv_id, params={"expand": ["payments"]})
    assert inv.object == "invoice" and inv.status == "open" and inv.amount_due == 2500 and inv.currency == "usd"
    assert inv.parent.type == "subscription_details"
    assert inv.parent.subscription_details.subscription == sub
    assert inv.lines.data[0].pricing.price_details.price == "price_monthly_pro"
    payment = inv.payments.data[0]
    assert payment.object == "invoice_payment" and payment.id.startswith("inpay_") and payment.status == "open"
    assert payment.payment.type == "payment_intent" and payment.payment.payment_intent.startswith("pi_")
    raw = inv.to_dict()
    for legacy_field in ("subscription", "charge", "payment_intent", "paid", "account"):
        assert legacy_field not in raw
    assert "price" not in raw["lines"]["data"][0]
    assert "payments" not in client.v1.invoices.retrieve(inv_id).to_dict()  # only when expanded
    assert inv.attempt_count == 0 and inv.next_payment_attempt is None
    assert inv.hosted_invoice_url.startswith(sim.base_url) and inv.billing_reason == "subscription_cycle"


def test_retrieve_legacy_shape(sim: StripeSimulator, legacy_client: stripe.StripeClient) -> None:
    _, sub, inv_id = renewal(sim)
    inv = legacy_client.v1.invoices.retrieve(inv_id)
    assert inv.subscription == sub and inv.paid is False and inv.charge is None
    assert inv.payment_intent.startswith("pi_")
    assert inv.lines.data[0].price.id == "price_monthly_pro" and inv.lines.data[0].plan.id == "price_monthly_pro"
    assert "parent" not in inv.to_dict() and "account" not in inv.to_dict()
    assert inv.last_response.headers["Stripe-Version"] == LEGACY
    for field in ("attempt_count", "next_payment_attempt", "amount_remaining", "period_start", "period_end",
                  "hosted_invoice_url", "billing_reason", "last_finalization_error", "customer"):
        assert field in inv.to_dict()


def test_subscription_customer_and_payment_objects(sim: StripeSimulator, client: stripe.StripeClient,
                                                   legacy_client: stripe.StripeClient) -> None:
    cus, sub, inv_id = renewal(sim)
    subscription = client.v1.subscriptions.retrieve(sub, params={"expand": ["customer"]})
    assert subscription.customer.id == cus and subscription.customer.email == "ada@example.com"
    assert subscription.items.data[0].price.id == "price_monthly_pro"
    assert subscription.items.data[0].price.recurring.interval == "month"
    assert subscription.status == "active"
    assert client.v1.customers.retrieve(cus).email == "ada@example.com"
    paid = client.v1.invoices.pay(inv_id, params={"expand": ["payments"]})
    pi_id = paid.payments.data[0].payment.payment_intent
    pi = client.v1.payment_intents.retrieve(pi_id)
    assert pi.status == "succeeded" and pi.amount_received == 2500 and "invoice" not in pi.to_dict()
    charge = client.v1.charges.retrieve(pi.latest_charge)
    assert charge.paid is True and charge.status == "succeeded" and charge.payment_intent == pi_id
    assert legacy_client.v1.charges.retrieve(charge.id).invoice == inv_id  # only legacy charges name the invoice
    assert legacy_client.v1.payment_intents.retrieve(pi_id).invoice == inv_id
    status, page = raw_request(f"{sim.base_url}/v1/invoice_payments?payment[type]=payment_intent"
                               f"&payment[payment_intent]={pi_id}", headers={"Authorization": "Bearer sk_test_x"})
    assert status == 200 and [p["invoice"] for p in page["data"]] == [inv_id]
    invoices = client.v1.invoices.list(params={"subscription": sub, "limit": 10})
    assert invoices.object == "list" and invoices.has_more is False and invoices.url == "/v1/invoices"
    assert [i.id for i in invoices.data][0] == inv_id and len(invoices.data) == 2


def test_auth_and_unknown_routes(sim: StripeSimulator) -> None:
    status, body = raw_request(f"{sim.base_url}/v1/invoices/in_x")
    assert status == 401 and body["error"]["type"] == "invalid_request_error"
    with pytest.raises(stripe.AuthenticationError):
        stripe.StripeClient("pk_test_wrong", base_addresses={"api": sim.base_url},
                            max_network_retries=0).v1.invoices.retrieve("in_x")
    status, body = raw_request(f"{sim.base_url}/v1/nothing/here", headers={"Authorization": "Bearer sk_test_x"})
    assert status == 404 and body["error"]["code"] == "resource_missing"
    with pytest.raises(stripe.InvalidRequestError) as missing:
        make_client(sim.base_url).v1.invoices.retrieve("in_missing")
    assert missing.value.http_status == 404 and missing.value.code == "resource_missing"


# ---------------------------------------------------------------- paying


def test_pay_success_records_one_charge(sim: StripeSimulator, client: stripe.StripeClient) -> None:
    _, _, inv_id = renewal(sim)
    inv = client.v1.invoices.pay(inv_id, options={"idempotency_key": "pay-1"})
    assert inv.status == "paid" and inv.amount_paid == 2500 and inv.amount_remaining == 0
    charges = sim.successful_charges(inv_id)
    assert len(charges) == 1 and charges[0]["idempotency_key"] == "pay-1" and charges[0]["id"].startswith("ch_")
    assert sim.total_charged(inv_id) == 2500
    types = [e["type"] for e in sim.events if e["data"]["object"]["id"] in (inv_id, charges[0]["payment_intent"])]
    assert {"invoice.paid", "invoice.payment_succeeded", "payment_intent.succeeded"} <= set(types)
    paid_event = sim.events_of_type("invoice.paid")[-1]
    assert paid_event["request"]["idempotency_key"] == "pay-1" and paid_event["request"]["id"].startswith("req_")


def test_pay_decline_raises_card_error(sim: StripeSimulator, client: stripe.StripeClient) -> None:
    _, _, inv_id = renewal(sim, card="insufficient_funds")
    with pytest.raises(stripe.CardError) as declined:
        client.v1.invoices.pay(inv_id, options={"idempotency_key": "pay-d"})
    err = declined.value
    assert err.http_status == 402 and err.code == "card_declined"
    assert err.error.decline_code == "insufficient_funds"  # the SDK's ErrorObject
    assert err.json_body["error"]["decline_code"] == "insufficient_funds"
    assert err.error.charge.startswith("ch_") and err.error.payment_intent.status == "requires_payment_method"
    inv = client.v1.invoices.retrieve(inv_id)
    assert inv.status == "open" and inv.attempt_count == 1 and sim.ledger[-1]["invoice"] != inv_id
    assert sim.events_of_type("invoice.payment_failed")[-1]["data"]["object"]["attempt_count"] == 1
    assert sim.events_of_type("payment_intent.payment_failed")
    # a replay of the declined request is the same decline, not a second attempt
    with pytest.raises(stripe.CardError):
        client.v1.invoices.pay(inv_id, options={"idempotency_key": "pay-d"})
    assert client.v1.invoices.retrieve(inv_id).attempt_count == 1
    sim.set_card(sim.get(inv_id)["customer"], "expired_card")
    with pytest.raises(stripe.CardError) as expired:
        client.v1.invoices.pay(inv_id)
    assert expired.value.code == "expired_card" and expired.value.error.decline_code == "expired_card"


def test_idempotent_replay_returns_same_response(sim: StripeSimulator, client: stripe.StripeClient) -> None:
    _, _, inv_id = renewal(sim)
    first = client.v1.invoices.pay(inv_id, options={"idempotency_key": "same"})
    second = client.v1.invoices.pay(inv_id, options={"idempotency_key": "same"})
    assert first.to_dict() == second.to_dict()
    assert second.last_response.headers.get("Idempotent-Replayed") == "true"
    assert len(sim.successful_charges(inv_id)) == 1 and len(sim.charges_for_key("same")) == 1
    with pytest.raises(stripe.InvalidRequestError) as again:  # a new key is a new request: already paid
        client.v1.invoices.pay(inv_id, options={"idempotency_key": "other"})
    assert again.value.http_status == 400 and "already paid" in again.value.user_message
    assert len(sim.successful_charges(inv_id)) == 1


def test_same_key_different_params_is_an_error(sim: StripeSimulator, client: stripe.StripeClient) -> None:
    _, _, inv_id = renewal(sim)
    client.v1.invoices.pay(inv_id, options={"idempotency_key": "k"})
    with pytest.raises(stripe.IdempotencyError) as misuse:
        client.v1.invoices.pay(inv_id, params={"off_session": True}, options={"idempotency_key": "k"})
    assert misuse.value.http_status == 400 and "same parameters" in misuse.value.user_message
    assert len(sim.successful_charges(inv_id)) == 1


def test_idempotency_keys_expire_after_retention(sim: StripeSimulator, client: stripe.StripeClient) -> None:
    now = [time.time()]
    sim.clock = lambda: now[0]
    _, _, inv_id = renewal(sim, card="insufficient_funds")
    with pytest.raises(stripe.CardError):
        client.v1.invoices.pay(inv_id, options={"idempotency_key": "k-exp"})
    now[0] += 23 * 3600
    with pytest.raises(stripe.IdempotencyError):  # still remembered within 24 h
        client.v1.invoices.pay(inv_id, params={"off_session": True}, options={"idempotency_key": "k-exp"})
    now[0] += 2 * 3600
    sim.set_card(sim.get(inv_id)["customer"], "ok")
    inv = client.v1.invoices.pay(inv_id, params={"off_session": True}, options={"idempotency_key": "k-exp"})
    assert inv.status == "paid" and inv.attempt_count == 2  # processed afresh, not replayed
    assert len(sim.successful_charges(inv_id)) == 1


def test_concurrent_request_with_key_in_flight_gets_409(sim: StripeSimulator) -> None:
    _, _, inv_id = renewal(sim)
    sim.faults.latency("POST /v1/invoices/*/pay", 0.6)
    results: dict[str, Any] = {}

    def pay(name: str) -> None:
        try:
            results[name] = make_client(sim.base_url).v1.invoices.pay(inv_id, options={"idempotency_key": "race"})
        except stripe.StripeError as exc:
            results[name] = exc

    first = threading.Thread(target=pay, args=("first",))
    first.start()
    time.sleep(0.2)
    pay("second")
    first.join()
    assert results["first"].status == "paid"
    conflict = results["second"]
    assert isinstance(conflict, stripe.APIError) and conflict.http_status == 409  # stripe-python: 409 → APIError
    assert conflict.error.type == "idempotency_error" and conflict.error.code == "idempotency_key_in_use"
    assert len(sim.successful_charges(inv_id)) == 1


def test_concurrent_burst_never_charges_twice(sim: StripeSimulator) -> None:
    _, _, inv_id = renewal(sim)

    def pay(client: stripe.StripeClient) -> str:
        try:
            inv = client.v1.invoices.pay(inv_id, options={"idempotency_key": "burst"})
            return "paid" if inv.status == "paid" else "?"
        except stripe.APIError as exc:
            return "409" if exc.http_status == 409 else f"error {exc.http_status}"

    clients = [make_client(sim.base_url) for _ in range(8)]
    outcomes = run_together([functools.partial(pay, client) for client in clients], timeout=60)
    assert set(outcomes) <= {"paid", "409"} and "paid" in outcomes
    assert len(sim.successful_charges(inv_id)) == 1


# ---------------------------------------------------------------- faults


def test_timeout_after_apply_then_retry_with_same_key(sim: StripeSimulator) -> None:
    _, _, inv_id = renewal(sim)
    sim.faults.timeout("POST /v1/invoices/*/pay", apply=True, hold_seconds=1.0)
    impatient = make_client(sim.base_url, timeout=0.3)
    with pytest.raises(stripe.APIConnectionError):
        impatient.v1.invoices.pay(inv_id, options={"idempotency_key": "t-1"})
    assert len(sim.successful_charges(inv_id)) == 1  # the charge happened: the indeterminate case
    retry = make_client(sim.base_url).v1.invoices.pay(inv_id, options={"idempotency_key": "t-1"})
    assert retry.status == "paid" and retry.last_response.headers.get("Idempotent-Replayed") == "true"
    assert len(sim.successful_charges(inv_id)) == 1


def test_timeout_before_apply_charges_only_on_retry(sim: StripeSimulator) -> None:
    _, _, inv_id = renewal(sim)
    sim.faults.timeout("POST /v1/invoices/*/pay", apply=False, hold_seconds=0.6)
    with pytest.raises(stripe.APIConnectionError):
        make_client(sim.base_url, timeout=0.2).v1.invoices.pay(inv_id, options={"idempotency_key": "t-2"})
    assert sim.successful_charges(inv_id) == [] and sim.get(inv_id)["status"] == "open"
    assert make_client(sim.base_url).v1.invoices.pay(inv_id, options={"idempotency_key": "t-2"}).status == "paid"
    assert len(sim.successful_charges(inv_id)) == 1


def test_500_after_apply_then_retry_replays_success(sim: StripeSimulator, client: stripe.StripeClient) -> None:
    _, _, inv_id = renewal(sim)
    sim.faults.error_500("POST /v1/invoices/*/pay", apply=True)
    with pytest.raises(stripe.APIError) as failed:
        client.v1.invoices.pay(inv_id, options={"idempotency_key": "e-1"})
    assert failed.value.http_status == 500
    assert len(sim.successful_charges(inv_id)) == 1
    retry = client.v1.invoices.pay(inv_id, options={"idempotency_key": "e-1"})
    assert retry.status == "paid" and retry.last_response.headers.get("Idempotent-Replayed") == "true"
    assert len(sim.successful_charges(inv_id)) == 1
    sim.faults.error_500("GET /v1/invoices/*", apply=False, count=2)
    for _ in range(2):
        with pytest.raises(stripe.APIError):
            client.v1.invoices.retrieve(inv_id)
    assert client.v1.invoices.retrieve(inv_id).status == "paid"


def test_stale_read_returns_previous_version(sim: StripeSimulator, client: stripe.StripeClient) -> None:
    _, _, inv_id = renewal(sim)
    client.v1.invoices.pay(inv_id)
    sim.faults.stale_read(inv_id, count=2)
    for _ in range(2):
        stale = client.v1.invoices.retrieve(inv_id, params={"expand": ["payments"]})
        assert stale.status == "open" and stale.payments.data[0].status == "open"
    assert client.v1.invoices.retrieve(inv_id).status == "paid"
    assert [v["status"] for v in sim.history(inv_id)] == ["draft", "open", "paid"]


# ---------------------------------------------------------------- events and webhooks


def test_events_list_newest_first_with_created_filter(sim: StripeSimulator, client: stripe.StripeClient) -> None:
    now = [time.time()]
    sim.clock = lambda: now[0]
    _, _, inv_id = renewal(sim)
    now[0] += 10
    client.v1.invoices.pay(inv_id)
    events = client.v1.events.list(params={"created": {"gt": 0}, "limit": 100})
    assert [e.id for e in events.data] == [e["id"] for e in reversed(sim.events)]
    recent = client.v1.events.list(params={"created": {"gt": int(now[0]) - 1}, "limit": 100})
    assert {e.type for e in recent.data} >= {"invoice.paid", "invoice.payment_succeeded", "payment_intent.succeeded"}
    assert "invoice.created" not in {e.type for e in recent.data}
    page = client.v1.events.list(params={"limit": 2})
    assert len(page.data) == 2 and page.has_more is True
    event = client.v1.events.retrieve(recent.data[0].id)
    assert event.object == "event" and event.account == "acct_demo" and event.livemode is False
    assert event.api_version == "2026-10-28.endive" and event.request.id is not None
    assert {"id", "created", "type", "data", "pending_webhooks", "request"} <= set(event.to_dict())


def test_webhook_signature_is_stripes(sim: StripeSimulator) -> None:
    renewal(sim)
    event = sim.events_of_type("invoice.finalized")[-1]
    body, headers = sim.signed_payload(event)
    header = headers["Stripe-Signature"]
    assert header.startswith("t=") and header.count("v1=") == 1
    parsed = stripe.Webhook.construct_event(body, header, SECRET, tolerance=300)
    assert parsed.id == event["id"] and parsed.data.object.status == "open"
    assert stripe.WebhookSignature.verify_header(body.decode(), header, SECRET, tolerance=300)
    with pytest.raises(stripe.SignatureVerificationError):
        stripe.Webhook.construct_event(body, header, "whsec_wrong", tolerance=300)
    _, old = sim.signed_payload(event, timestamp=int(time.time()) - 3600)
    with pytest.raises(stripe.SignatureVerificationError):
        stripe.Webhook.construct_event(body, old["Stripe-Signature"], SECRET, tolerance=300)


def test_secret_rolling_signs_with_every_secret() -> None:
    sim = StripeSimulator(webhook_secrets=["whsec_old", "whsec_new"])
    sim.create_customer("roll@example.com")
    body, headers = sim.signed_payload(sim.events[0])
    assert headers["Stripe-Signature"].count("v1=") == 2
    for secret in ("whsec_old", "whsec_new"):
        assert stripe.Webhook.construct_event(body, headers["Stripe-Signature"], secret, tolerance=300).id


def test_webhook_payload_follows_the_webhook_api_version() -> None:
    legacy = StripeSimulator(webhook_api_version=LEGACY)
    _, sub, inv_id = renewal(legacy)
    obj = legacy.events_of_type("invoice.finalized")[-1]["data"]["object"]
    assert obj["subscription"] == sub and "parent" not in obj and legacy.events[0]["api_version"] == LEGACY
    modern = StripeSimulator()
    _, sub, _ = renewal(modern)
    obj = modern.events_of_type("invoice.finalized")[-1]["data"]["object"]
    assert obj["parent"]["subscription_details"]["subscription"] == sub and "subscription" not in obj


def test_auto_delivery_in_creation_order_to_callable_sink() -> None:
    sink = Collector()
    sim = StripeSimulator(sink=sink, auto_deliver=True)
    base = sim.start()
    try:
        _, _, inv_id = renewal(sim)
        make_client(base).v1.invoices.pay(inv_id)
        assert sink.ids == [e["id"] for e in sim.events] and sim.outbox == []
        assert [e.type for e in sink.events[-4:]] == ["charge.succeeded", "payment_intent.succeeded", "invoice.paid",
                                                      "invoice.payment_succeeded"]
        assert sink.events[-1].data.object.id == inv_id and sink.events[-1].request.idempotency_key
    finally:
        sim.stop()


def test_manual_delivery_orders_are_deterministic() -> None:
    sink = Collector()
    sim = StripeSimulator(sink=sink)
    renewal(sim)
    created = [e["id"] for e in sim.events]
    assert [e["id"] for e in sim.pending_events()] == created
    assert sink.events == []
    results = sim.deliver_all(order="reversed")
    assert all(r.ok for r in results) and sink.ids == list(reversed(created)) and sim.pending_events() == []

    def shuffled(seed: int) -> list[str]:
        collector = Collector()
        other = StripeSimulator(sink=collector)
        renewal(other)
        ids = [e["id"] for e in other.events]
        other.deliver_all(order="shuffled", seed=seed)
        return [ids.index(i) for i in collector.ids]

    expected = list(range(len(created)))
    random.Random(7).shuffle(expected)
    assert shuffled(7) == shuffled(7) == expected != sorted(expected)


def test_duplicate_and_failed_deliveries() -> None:
    sink = Collector()
    sim = StripeSimulator(sink=sink)
    cus = sim.create_customer("dup@example.com")
    sim.faults.duplicate_next_delivery(1)
    sim.deliver_all()
    assert len(sink.events) == 2 and sink.events[0].id == sink.events[1].id
    first = sim.events[0]["id"]
    sim.deliver(first, duplicate=3)  # re-send an already delivered event
    assert sink.ids.count(first) == 5
    sink.status = 500
    sim.set_card(cus, "ok")
    sim.create_subscription(cus, "price_monthly_pro")
    failed = sim.deliver_all()
    assert failed and not any(r.ok for r in failed)
    assert all(e.attempts == 1 and e.last_status == 500 for e in sim.outbox)
    sink.status = 200
    assert all(r.ok and r.attempt == 2 for r in sim.deliver_all()) and sim.outbox == []


def test_delayed_deliveries_wait_for_deliver_due() -> None:
    now = [time.time()]
    sink = Collector()
    sim = StripeSimulator(sink=sink, auto_deliver=True, clock=lambda: now[0])
    sim.faults.delay_deliveries(60, count=1)
    sim.create_customer("late@example.com")  # delayed
    sim.create_customer("early@example.com")  # not delayed
    assert [e.data.object.email for e in sink.events] == ["early@example.com"]
    assert sim.deliver_due() == []
    now[0] += 61
    assert [r.ok for r in sim.deliver_due()] == [True]
    assert [e.data.object.email for e in sink.events] == ["early@example.com", "late@example.com"]


def test_url_sink_receives_signed_posts() -> None:
    received: list[tuple[bytes, str]] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            received.append((self.rfile.read(int(self.headers["Content-Length"])), self.headers["Stripe-Signature"]))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    hook = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    try:
        sim = StripeSimulator(sink=f"http://127.0.0.1:{hook.server_address[1]}/webhooks/stripe/", auto_deliver=True)
        sim.create_customer("url@example.com")
        assert len(received) == 1
        body, header = received[0]
        assert stripe.Webhook.construct_event(body, header, SECRET, tolerance=300).type == "customer.created"
    finally:
        hook.shutdown()
        hook.server_close()


# ---------------------------------------------------------------- provider retries and transitions


def test_provider_smart_retry_schedule() -> None:
    now = [time.time()]
    sim = StripeSimulator(clock=lambda: now[0], mark_uncollectible_after_attempts=True)
    _, sub, inv_id = renewal(sim, card="insufficient_funds")
    for attempt, delay in enumerate([3 * DAY, 5 * DAY, 7 * DAY], start=1):
        result = sim.provider_attempt(inv_id)
        assert not result.ok and result.decline_code == "insufficient_funds" and result.attempt_count == attempt
        assert result.next_payment_attempt == int(now[0]) + delay
        failed = sim.events_of_type("invoice.payment_failed")[-1]["data"]["object"]
        assert failed["next_payment_attempt"] == int(now[0]) + delay and failed["attempt_count"] == attempt
        now[0] += delay
    assert sim.get(sub)["status"] == "past_due"
    last = sim.provider_attempt(inv_id)
    assert last.attempt_count == 4 and last.next_payment_attempt is None
    assert sim.get(inv_id)["status"] == "uncollectible"
    assert sim.events[-1]["type"] == "invoice.marked_uncollectible"
    assert sim.successful_charges(inv_id) == []


def test_default_clock_follows_time_machine() -> None:
    import time_machine

    sim = StripeSimulator()
    moment = datetime(2030, 1, 1, 12, tzinfo=UTC)
    with time_machine.travel(moment, tick=False):
        _, _, inv_id = renewal(sim, card="processing_error")
        result = sim.provider_attempt(inv_id)
    assert result.code == "processing_error"  # Stripe reports processing errors under their own code
    assert result.next_payment_attempt == int(moment.timestamp()) + 3 * DAY
    assert sim.events[-1]["created"] == int(moment.timestamp())


def test_hard_decline_is_not_retried_and_reschedule_updates() -> None:
    sim = StripeSimulator()
    cus, _, inv_id = renewal(sim, card="stolen_card")
    result = sim.provider_attempt(inv_id)
    assert result.code == "card_declined" and result.decline_code == "stolen_card"
    assert result.next_payment_attempt is None
    when = int(time.time()) + 2 * DAY
    sim.reschedule(inv_id, when)
    updated = sim.events[-1]
    assert updated["type"] == "invoice.updated" and updated["data"]["object"]["next_payment_attempt"] == when
    assert updated["data"]["previous_attributes"] == {"next_payment_attempt": None}
    sim.set_card(cus, "ok")
    assert sim.provider_attempt(inv_id).ok and sim.get(inv_id)["next_payment_attempt"] is None


def test_invoice_status_transitions(sim: StripeSimulator, client: stripe.StripeClient) -> None:
    cus = sim.create_customer("t@example.com")
    sub = sim.create_subscription(cus, "price_monthly_pro")
    draft = sim.create_renewal_invoice(sub, finalize=False)
    assert sim.get(draft)["status"] == "draft"
    with pytest.raises(InvalidTransition):
        sim.void(draft)
    assert client.v1.invoices.finalize_invoice(draft).status == "open"
    with pytest.raises(InvalidTransition):
        sim.finalize(draft)
    assert client.v1.invoices.void_invoice(draft).status == "void"
    assert sim.events[-1]["type"] == "invoice.voided"
    with pytest.raises(stripe.InvalidRequestError) as void_pay:
        client.v1.invoices.pay(draft)
    assert void_pay.value.http_status == 400
    with pytest.raises(InvalidTransition):
        sim.mark_uncollectible(draft)

    bad = sim.create_renewal_invoice(sub)
    assert client.v1.invoices.mark_uncollectible(bad).status == "uncollectible"
    assert sim.events[-1]["type"] == "invoice.marked_uncollectible"
    assert client.v1.invoices.pay(bad).status == "paid"  # an uncollectible invoice may still be paid
    with pytest.raises(InvalidTransition):
        sim.void(bad)
    with pytest.raises(stripe.InvalidRequestError):
        client.v1.invoices.void_invoice(bad)

    pending = sim.create_renewal_invoice(sub)
    sim.set_card(cus, "insufficient_funds")
    paid = sim.customer_pays(pending)
    assert paid.ok and sim.get(pending)["status"] == "paid" and sim.ledger[-1]["source"] == "customer"
    with pytest.raises(InvalidTransition):
        sim.customer_pays(pending)


def test_refunds_and_disputes(sim: StripeSimulator, client: stripe.StripeClient) -> None:
    _, _, inv_id = renewal(sim)
    client.v1.invoices.pay(inv_id)
    charge_id = sim.successful_charges(inv_id)[0]["id"]
    refund_id = sim.refund(charge_id, 500)
    assert client.v1.refunds.retrieve(refund_id).amount == 500
    refunded = sim.events_of_type("charge.refunded")[-1]
    assert refunded["data"]["object"]["amount_refunded"] == 500 and refunded["data"]["object"]["refunded"] is False
    assert sim.successful_charges(inv_id)[0]["refunded"] == 500
    with pytest.raises(Exception, match="greater than"):
        sim.refund(charge_id, 5000)
    sim.refund(sim.get(charge_id)["payment_intent"])  # the rest, addressed by payment intent
    assert client.v1.charges.retrieve(charge_id).refunded is True
    assert sim.net_charged(inv_id) == 0 and sim.total_charged(inv_id) == 2500

    _, _, second = renewal(sim)
    client.v1.invoices.pay(second)
    charge_id = sim.successful_charges(second)[0]["id"]
    dispute_id = sim.open_dispute(charge_id)
    assert [e["type"] for e in sim.events[-2:]] == ["charge.dispute.created", "charge.dispute.funds_withdrawn"]
    dispute = client.v1.disputes.retrieve(dispute_id)
    assert dispute.status == "needs_response" and dispute.charge == charge_id and dispute.amount == 2500
    sim.close_dispute(dispute_id, won=True)
    assert [e["type"] for e in sim.events[-2:]] == ["charge.dispute.closed", "charge.dispute.funds_reinstated"]
    assert client.v1.disputes.retrieve(dispute_id).status == "won"
    with pytest.raises(InvalidTransition):
        sim.close_dispute(dispute_id, won=False)

    _, _, third = renewal(sim)
    client.v1.invoices.pay(third)
    lost = sim.open_dispute(sim.successful_charges(third)[0]["id"])
    sim.close_dispute(lost, won=False)
    assert sim.events[-1]["type"] == "charge.dispute.closed" and sim.events[-1]["data"]["object"]["status"] == "lost"
    assert sim.successful_charges(third)[0]["dispute_status"] == "lost" and sim.net_charged(third) == 0


# ---------------------------------------------------------------- CLI


def test_cli_control_api_drill() -> None:
    received: list[Any] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append(stripe.Webhook.construct_event(body, self.headers["Stripe-Signature"], SECRET, 300))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    hook = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.verification.fake_stripe", "--port", str(port), "--secret", SECRET,
         "--auto-deliver",
         "--webhook-url", f"http://127.0.0.1:{hook.server_address[1]}/webhooks/stripe/"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        assert "listening on" in proc.stdout.readline()
        base = f"http://127.0.0.1:{port}"

        def control(path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
            data = None if body is None else json.dumps(body).encode()
            status, payload = raw_request(base + path, method="GET" if body is None else "POST", data=data,
                                          headers={"Content-Type": "application/json"})
            assert status == 200, payload
            return payload

        cus = control("/_sim/customers", {"email": "drill@example.com"})["id"]
        sub = control("/_sim/subscriptions", {"customer": cus, "price": "price_monthly_pro", "amount": 1500})["id"]
        control(f"/_sim/customers/{cus}/card", {"card": "insufficient_funds"})
        inv = control(f"/_sim/subscriptions/{sub}/renewal", {})["id"]
        attempt = control(f"/_sim/invoices/{inv}/attempt", {})
        assert attempt["result"]["ok"] is False and attempt["invoice"]["next_payment_attempt"] is not None
        assert make_client(base).v1.invoices.retrieve(inv).attempt_count == 1
        control(f"/_sim/invoices/{inv}/customer_pays", {})
        ledger = control("/_sim/ledger")
        assert ledger["count"] == 2 and [e["amount"] for e in ledger["ledger"]] == [1500, 1500]
        assert ledger["ledger"][-1]["invoice"] == inv
        deadline = time.time() + 5
        while "invoice.paid" not in [e.type for e in received] and time.time() < deadline:
            time.sleep(0.05)
        types = [e.type for e in received]
        assert "invoice.payment_failed" in types and types[-1] in ("invoice.payment_succeeded",
                                                                    "customer.subscription.updated")
        assert control("/_sim/events/pending")["data"] == []
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        hook.shutdown()
        hook.server_close()
