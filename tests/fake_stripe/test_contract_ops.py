"""The subscription as a contract (cancel, cancel at period end, pause, resume, price change, trial,
period end), through the product's Stripe adapter and the real SDK, against the simulator over
loopback HTTP, in both API shapes."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import stripe

from subscriptions.providers.base import ProviderIndeterminate, ProviderNotFound, ProviderRequestError
from subscriptions.providers.stripe_adapter import StripeProvider
from subscriptions.providers.stripe_shapes import parse_subscription
from tests.verification.fake_stripe import InvalidTransition, SimError, StripeSimulator
from tests.verification.fake_stripe.billing import DAY

LEGACY = "2024-06-20"
NEW = "2026-10-28.endive"
SHAPES = pytest.mark.parametrize("version", [LEGACY, NEW], ids=["legacy", "new"])


@pytest.fixture
def sim() -> Iterator[StripeSimulator]:
    simulator = StripeSimulator()
    simulator.start()
    yield simulator
    simulator.stop()


def adapter(sim: StripeSimulator, version: str | None = NEW, *, timeout: float = 10.0) -> StripeProvider:
    return StripeProvider(api_key="sk_test_local", api_base=sim.base_url, webhook_secrets=["whsec_local"],
                          account="acct_demo", timeout=timeout, api_version=version)


def sdk(sim: StripeSimulator, version: str | None = NEW) -> stripe.StripeClient:
    return stripe.StripeClient("sk_test_local", base_addresses={"api": sim.base_url}, max_network_retries=0,
                               stripe_version=version)


def subscribed(sim: StripeSimulator, *, card: str = "ok", price: str = "price_monthly_pro", amount: int = 2000,
               trial_days: int = 0) -> tuple[str, str]:
    cus = sim.create_customer("ada@example.com", card)
    return cus, sim.create_subscription(cus, price, amount=amount, trial_days=trial_days)


def utc(ts: int | None) -> datetime | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC)


def types_for(sim: StripeSimulator, object_id: str) -> list[str]:
    return [e["type"] for e in sim.events if e["data"]["object"]["id"] == object_id]


def http(sim: StripeSimulator, method: str, path: str, *, form: str | None = None, json_body: Any = None,
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    data = form.encode() if form is not None else (json.dumps(json_body).encode() if json_body is not None else None)
    hdrs = {"Authorization": "Bearer sk_test_x", **(headers or {})}
    if form is not None:
        hdrs["Content-Type"] = "application/x-www-form-urlencoded"
    request = urllib.request.Request(sim.base_url + path, data=data, headers=hdrs, method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


# ---------------------------------------------------------------- reading the contract


@SHAPES
def test_fetch_subscription_reads_the_period_in_both_shapes(sim: StripeSimulator, version: str) -> None:
    cus, sub_id = subscribed(sim)
    internal = sim.get(sub_id)
    contract = adapter(sim, version).fetch_subscription(sub_id)
    assert (contract.id, contract.account, contract.customer_id, contract.customer_email) == (
        sub_id, "acct_demo", cus, "ada@example.com")
    assert (contract.status, contract.price_ids, contract.interval) == ("active", ("price_monthly_pro",), "month")
    assert contract.current_period_start == utc(internal["current_period_start"])
    assert contract.current_period_end == utc(internal["current_period_end"])
    assert contract.current_period_end - contract.current_period_start >= timedelta(days=28)
    assert contract.current_period_end.tzinfo is UTC
    assert contract.cancel_at_period_end is False
    assert contract.pause_behavior == "" and contract.pause_resumes_at is None
    assert contract.canceled_at is None and contract.ended_at is None and contract.trial_end is None
    # Where the period sits differs by version; the adapter reads both.
    item = contract.raw["items"]["data"][0]
    if version == LEGACY:
        assert contract.raw["current_period_end"] == internal["current_period_end"] and "current_period_end" not in item
    else:
        assert "current_period_end" not in contract.raw and item["current_period_end"] == internal["current_period_end"]


def test_parse_subscription_takes_the_latest_item_end_and_reads_pauses() -> None:
    raw = {"id": "sub_1", "customer": "cus_1", "status": "paused", "pause_collection": None,
           "trial_end": 1_700_000_000, "canceled_at": None, "ended_at": None, "cancel_at_period_end": False,
           "items": {"data": [
               {"price": {"id": "price_a", "recurring": {"interval": "year"}}, "current_period_start": 100,
                "current_period_end": 200},
               {"price": {"id": "price_b", "recurring": {"interval": "year"}}, "current_period_start": 150,
                "current_period_end": 900},
           ]}}
    contract = parse_subscription(raw, account="acct_x")
    assert contract.price_ids == ("price_a", "price_b") and contract.interval == "year"
    assert (contract.current_period_start, contract.current_period_end) == (utc(150), utc(900))
    assert contract.customer_id == "cus_1" and contract.customer_email == ""
    # status paused (a trial ended without a payment method), no pause_collection
    assert (contract.pause_behavior, contract.pause_resumes_at) == ("paused", None)
    assert contract.trial_end == utc(1_700_000_000)
    raw.update(status="active", pause_collection={"behavior": "keep_as_draft", "resumes_at": 1_800_000_000},
               canceled_at=1_750_000_000, cancel_at_period_end=True)
    contract = parse_subscription(raw, account="acct_x")
    assert (contract.pause_behavior, contract.pause_resumes_at) == ("keep_as_draft", utc(1_800_000_000))
    assert contract.cancel_at_period_end is True and contract.canceled_at == utc(1_750_000_000)
    raw["pause_collection"] = None
    assert parse_subscription(raw, account="acct_x").pause_behavior == ""


# ---------------------------------------------------------------- cancel now


@SHAPES
def test_cancel_through_the_adapter_and_again_is_idempotent(sim: StripeSimulator, version: str) -> None:
    _, sub_id = subscribed(sim)
    provider = adapter(sim, version)
    canceled = provider.cancel_subscription(sub_id, idempotency_key="cancel-1")
    assert canceled.status == "canceled" and canceled.customer_email == "ada@example.com"
    assert canceled.canceled_at is not None and canceled.ended_at is not None
    assert abs(canceled.ended_at - datetime.now(UTC)) < timedelta(minutes=1)
    assert types_for(sim, sub_id).count("customer.subscription.deleted") == 1
    deleted = sim.events_of_type("customer.subscription.deleted")[-1]
    assert deleted["request"]["id"].startswith("req_")

    # Stripe answers a second cancel with 404 "No such subscription" (the key does not replay a
    # DELETE); the adapter reads the subscription back and returns it, canceled.
    with pytest.raises(stripe.InvalidRequestError) as again:
        sdk(sim, version).v1.subscriptions.cancel(sub_id, options={"idempotency_key": "cancel-1"})
    assert again.value.http_status == 404 and again.value.code == "resource_missing"
    assert "No such subscription" in again.value.user_message
    for key in ("cancel-1", "cancel-2"):
        repeat = provider.cancel_subscription(sub_id, idempotency_key=key)
        assert repeat.status == "canceled" and repeat.ended_at == canceled.ended_at
    assert types_for(sim, sub_id).count("customer.subscription.deleted") == 1  # canceled once
    assert provider.fetch_subscription(sub_id).status == "canceled"  # still readable


def test_cancel_errors_are_typed(sim: StripeSimulator) -> None:
    provider = adapter(sim)
    with pytest.raises(ProviderNotFound):
        provider.cancel_subscription("sub_missing", idempotency_key="k")
    with pytest.raises(ValueError):
        provider.cancel_subscription("sub_missing", idempotency_key="")


def test_cancel_refused_for_another_reason_is_not_swallowed(sim: StripeSimulator, monkeypatch) -> None:
    """A 4xx on cancel counts as 'already canceled' only when the subscription reads canceled."""
    _, sub_id = subscribed(sim)

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise InvalidTransition("Simulated refusal.")

    monkeypatch.setattr(sim, "cancel_subscription", refuse)
    with pytest.raises(ProviderRequestError, match="Simulated refusal"):
        adapter(sim).cancel_subscription(sub_id, idempotency_key="k")
    assert sim.get(sub_id)["status"] == "active"


def test_cancel_stops_retries_and_the_debt_stays(sim: StripeSimulator) -> None:
    cus, sub_id = subscribed(sim)
    sim.set_card(cus, "insufficient_funds")
    inv_id = sim.create_renewal_invoice(sub_id)
    first = sim.provider_attempt(inv_id)
    assert not first.ok and first.next_payment_attempt is not None
    provider = adapter(sim)
    assert provider.fetch_invoice(inv_id).next_payment_attempt is not None
    ledger_before = sim.ledger

    provider.cancel_subscription(sub_id, idempotency_key="stop")
    invoice = provider.fetch_invoice(inv_id)
    assert invoice.status == "open" and invoice.next_payment_attempt is None  # debt stays debt, no retries
    assert invoice.amount_due == 2000 and invoice.amount_paid == 0 and invoice.raw["auto_advance"] is False
    updated = sim.events_of_type("invoice.updated")[-1]
    assert updated["data"]["object"]["id"] == inv_id
    assert updated["data"]["previous_attributes"] == {"auto_advance": True,
                                                      "next_payment_attempt": first.next_payment_attempt}
    with pytest.raises(InvalidTransition, match="auto_advance"):
        sim.provider_attempt(inv_id)
    assert sim.ledger == ledger_before
    # The customer can still pay what is owed; the subscription stays canceled.
    assert sim.customer_pays(inv_id).ok and sim.get(inv_id)["status"] == "paid"
    assert sim.get(sub_id)["status"] == "canceled"


# ---------------------------------------------------------------- cancel at the period end


@SHAPES
def test_cancel_at_period_end_over_http_then_the_period_ends(sim: StripeSimulator, version: str) -> None:
    _, sub_id = subscribed(sim)
    period_end = sim.get(sub_id)["current_period_end"]
    updated = sdk(sim, version).v1.subscriptions.update(sub_id, params={"cancel_at_period_end": True})
    assert updated.cancel_at_period_end is True and updated.cancel_at == period_end and updated.status == "active"
    event = sim.events_of_type("customer.subscription.updated")[-1]
    assert event["data"]["previous_attributes"] == {"cancel_at_period_end": False, "cancel_at": None,
                                                    "canceled_at": None}
    contract = adapter(sim, version).fetch_subscription(sub_id)
    assert contract.cancel_at_period_end is True and contract.status == "active"
    assert contract.canceled_at is not None and contract.ended_at is None  # canceled_at: the request time

    invoices_before = len(sim.invoices(sub_id))
    assert sim.end_period(sub_id) is None  # canceled instead of renewed
    assert len(sim.invoices(sub_id)) == invoices_before
    ended = adapter(sim, version).fetch_subscription(sub_id)
    assert ended.status == "canceled" and ended.ended_at == utc(period_end)
    assert ended.canceled_at == contract.canceled_at
    assert sim.events[-1]["type"] == "customer.subscription.deleted"
    with pytest.raises(InvalidTransition):
        sim.end_period(sub_id)


def test_cancel_at_period_end_can_be_taken_back(sim: StripeSimulator) -> None:
    _, sub_id = subscribed(sim)
    sim.cancel_subscription(sub_id, at_period_end=True)
    assert sim.events[-1]["type"] == "customer.subscription.updated"
    count = len(sim.events)
    sim.cancel_subscription(sub_id, at_period_end=True)  # nothing changes, nothing is emitted
    assert len(sim.events) == count
    back = sdk(sim).v1.subscriptions.update(sub_id, params={"cancel_at_period_end": False})
    assert back.cancel_at_period_end is False and back.cancel_at is None and back.canceled_at is None
    inv_id = sim.end_period(sub_id)
    assert inv_id is not None and sim.get(sub_id)["status"] == "active"


# ---------------------------------------------------------------- pause and resume collection


@SHAPES
def test_pause_collection_over_http_holds_new_invoices(sim: StripeSimulator, version: str) -> None:
    cus, sub_id = subscribed(sim)
    sim.set_card(cus, "insufficient_funds")
    before_pause = sim.create_renewal_invoice(sub_id)
    resumes = int(time.time()) + 400 * DAY  # after every period this test starts
    client = sdk(sim, version)
    paused = client.v1.subscriptions.update(
        sub_id, params={"pause_collection": {"behavior": "keep_as_draft", "resumes_at": resumes}})
    assert paused.pause_collection.behavior == "keep_as_draft" and paused.pause_collection.resumes_at == resumes
    assert paused.status == "active"
    event = sim.events_of_type("customer.subscription.updated")[-1]
    assert event["data"]["previous_attributes"] == {"pause_collection": None}
    contract = adapter(sim, version).fetch_subscription(sub_id)
    assert (contract.status, contract.pause_behavior, contract.pause_resumes_at) == (
        "active", "keep_as_draft", utc(resumes))

    held = sim.create_renewal_invoice(sub_id)
    assert sim.get(held)["status"] == "draft" and sim.get(held)["auto_advance"] is False
    with pytest.raises(InvalidTransition):
        sim.provider_attempt(held)
    assert sim.successful_charges(held) == [] and sim.get(held)["attempt_count"] == 0
    # An invoice issued before the pause is still retried (as on Stripe).
    assert sim.provider_attempt(before_pause).attempt_count == 1

    resumed = client.v1.subscriptions.update(sub_id, params={"pause_collection": ""})
    assert resumed.pause_collection is None
    assert sim.events_of_type("customer.subscription.updated")[-1]["data"]["previous_attributes"] == {
        "pause_collection": {"behavior": "keep_as_draft", "resumes_at": resumes}}
    assert adapter(sim, version).fetch_subscription(sub_id).pause_behavior == ""
    collected = sim.create_renewal_invoice(sub_id)
    assert sim.get(collected)["status"] == "open" and sim.get(collected)["auto_advance"] is True


@pytest.mark.parametrize(("behavior", "status"), [("void", "void"), ("mark_uncollectible", "uncollectible")])
def test_paused_collection_behaviours(sim: StripeSimulator, behavior: str, status: str) -> None:
    _, sub_id = subscribed(sim)
    sim.pause_subscription(sub_id, behavior=behavior)
    assert sim.events[-1]["type"] == "customer.subscription.updated"
    ledger = sim.ledger
    inv_id = sim.end_period(sub_id)
    assert sim.get(inv_id)["status"] == status and sim.get(inv_id)["attempt_count"] == 0
    with pytest.raises(InvalidTransition):
        sim.provider_attempt(inv_id)
    assert sim.ledger == ledger
    assert adapter(sim).fetch_invoice(inv_id).status == status


def test_pause_ends_by_itself_at_resumes_at(sim: StripeSimulator) -> None:
    _, sub_id = subscribed(sim)
    period_end = sim.get(sub_id)["current_period_end"]
    sim.pause_subscription(sub_id, resumes_at=period_end - DAY, behavior="void")
    inv_id = sim.end_period(sub_id)  # the period starts after resumes_at: collection is back
    assert sim.get(sub_id)["pause_collection"] is None and sim.get(inv_id)["status"] == "open"
    assert [e["type"] for e in sim.events if e["type"].startswith("customer.subscription")][-1] == \
        "customer.subscription.updated"


def test_pause_and_update_are_validated_before_anything_changes(sim: StripeSimulator) -> None:
    _, sub_id = subscribed(sim)
    count = len(sim.events)
    status, body = http(sim, "POST", f"/v1/subscriptions/{sub_id}",
                        form="cancel_at_period_end=true&pause_collection[behavior]=sometimes")
    assert status == 400 and body["error"]["param"] == "pause_collection[behavior]"
    status, body = http(sim, "POST", f"/v1/subscriptions/{sub_id}",
                        form="cancel_at_period_end=true&items[0][price]=price_nobody_has")
    assert status == 400 and body["error"]["code"] == "resource_missing" and "No such price" in body["error"]["message"]
    status, body = http(sim, "POST", f"/v1/subscriptions/{sub_id}", form="items[0][id]=si_other&items[0][price]=x")
    assert status == 400 and body["error"]["param"] == "items[0][id]"
    assert len(sim.events) == count and sim.get(sub_id)["cancel_at_period_end"] is False
    with pytest.raises(SimError):
        sim.pause_subscription(sub_id, behavior="sometimes")


def test_a_canceled_subscription_cannot_be_changed(sim: StripeSimulator) -> None:
    _, sub_id = subscribed(sim)
    sim.cancel_subscription(sub_id)
    status, body = http(sim, "POST", f"/v1/subscriptions/{sub_id}", form="pause_collection[behavior]=void")
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"] == "A canceled subscription can only update its cancellation_details and metadata."
    for op in (lambda: sim.pause_subscription(sub_id), lambda: sim.change_price(sub_id, "price_other"),
               lambda: sim.cancel_subscription(sub_id, at_period_end=True)):
        with pytest.raises(SimError):
            op()
    assert http(sim, "DELETE", f"/v1/subscriptions/{sub_id}")[0] == 404


# ---------------------------------------------------------------- price changes


@SHAPES
def test_a_price_change_shows_on_the_next_renewal_only(sim: StripeSimulator, version: str) -> None:
    other_cus = sim.create_customer("other@example.com")
    sim.create_subscription(other_cus, "price_monthly_max", amount=4500)  # makes price_monthly_max known
    _, sub_id = subscribed(sim)
    provider = adapter(sim, version)
    earlier = sim.end_period(sub_id)
    item_id = sim.get(sub_id)["item_id"]
    changed = sdk(sim, version).v1.subscriptions.update(
        sub_id, params={"items": [{"id": item_id, "price": "price_monthly_max"}], "proration_behavior": "none"})
    assert changed["items"].data[0].price.id == "price_monthly_max"
    event = sim.events_of_type("customer.subscription.updated")[-1]
    assert event["data"]["object"]["items"]["data"][0]["price"]["id"] == "price_monthly_max"
    assert event["data"]["previous_attributes"]["items"]["data"][0]["price"]["id"] == "price_monthly_pro"
    assert provider.fetch_subscription(sub_id).price_ids == ("price_monthly_max",)

    later = sim.end_period(sub_id)
    new_invoice, old_invoice = provider.fetch_invoice(later), provider.fetch_invoice(earlier)
    assert new_invoice.price_ids == ("price_monthly_max",) and new_invoice.amount_due == 4500
    assert old_invoice.price_ids == ("price_monthly_pro",) and old_invoice.amount_due == 2000


def test_change_price_with_a_new_interval_in_python(sim: StripeSimulator) -> None:
    _, sub_id = subscribed(sim)
    sim.change_price(sub_id, "price_yearly_pro", interval="year", amount=20000)
    assert sim.events[-1]["type"] == "customer.subscription.updated"
    contract = adapter(sim, LEGACY).fetch_subscription(sub_id)
    assert contract.price_ids == ("price_yearly_pro",) and contract.interval == "year"
    inv = adapter(sim, LEGACY).fetch_invoice(sim.end_period(sub_id))
    assert inv.price_ids == ("price_yearly_pro",) and inv.amount_due == 20000
    assert inv.period_end - inv.period_start >= timedelta(days=365)
    with pytest.raises(SimError):  # a known price keeps its own interval
        sim.change_price(sub_id, "price_yearly_pro", interval="month")


# ---------------------------------------------------------------- trials


@SHAPES
def test_trial_then_it_ends_active(sim: StripeSimulator, version: str) -> None:
    _, sub_id = subscribed(sim, trial_days=14)
    provider = adapter(sim, version)
    trialing = provider.fetch_subscription(sub_id)
    assert trialing.status == "trialing" and trialing.trial_end is not None
    assert trialing.current_period_end == trialing.trial_end
    assert trialing.trial_end - datetime.now(UTC) > timedelta(days=13)
    first = provider.fetch_invoice(sim.get(sub_id)["latest_invoice"])
    assert (first.status, first.amount_due, first.payment_refs) == ("paid", 0, ())  # $0, no charge
    assert sim.ledger == []

    inv_id = sim.end_trial(sub_id)
    active = provider.fetch_subscription(sub_id)
    assert active.status == "active" and active.trial_end < trialing.trial_end  # ended early: trial_end = now
    assert active.current_period_start == active.trial_end
    invoice = provider.fetch_invoice(inv_id)
    assert invoice.status == "open" and invoice.amount_due == 2000 and invoice.billing_reason == "subscription_cycle"
    assert invoice.period_start == active.current_period_start and invoice.period_end == active.current_period_end
    trail = [e["type"] for e in sim.events][-3:]
    assert trail == ["customer.subscription.updated", "invoice.created", "invoice.finalized"]
    assert sim.provider_attempt(inv_id).ok and sim.ledger[-1]["amount"] == 2000


def test_trial_ending_at_the_period_end_starts_paying(sim: StripeSimulator) -> None:
    _, sub_id = subscribed(sim, trial_days=7)
    trial_end = sim.get(sub_id)["trial_end"]
    inv_id = sim.end_period(sub_id)
    sub = sim.get(sub_id)
    assert sub["status"] == "active" and sub["trial_end"] == trial_end and sub["current_period_start"] == trial_end
    assert sim.get(inv_id)["period_start"] == trial_end and sim.get(inv_id)["amount_due"] == 2000


def test_trial_ends_paused_then_resumes_over_http(sim: StripeSimulator) -> None:
    _, sub_id = subscribed(sim, trial_days=14)
    assert sim.end_trial(sub_id, outcome="paused") is None
    assert [e["type"] for e in sim.events][-2:] == ["customer.subscription.updated", "customer.subscription.paused"]
    contract = adapter(sim).fetch_subscription(sub_id)
    assert (contract.status, contract.pause_behavior, contract.pause_resumes_at) == ("paused", "paused", None)
    with pytest.raises(InvalidTransition):
        sim.end_period(sub_id)  # a paused subscription makes no invoices

    resumed = sdk(sim).v1.subscriptions.resume(sub_id)
    assert resumed.status == "active"
    types = [e["type"] for e in sim.events][-4:]
    assert types == ["customer.subscription.updated", "customer.subscription.resumed", "invoice.created",
                     "invoice.finalized"]
    assert sim.get(sim.get(sub_id)["latest_invoice"])["status"] == "open"
    status, body = http(sim, "POST", f"/v1/subscriptions/{sub_id}/resume")
    assert status == 400 and "paused" in body["error"]["message"]  # only status=paused resumes here


def test_trial_ends_canceled(sim: StripeSimulator) -> None:
    _, sub_id = subscribed(sim, trial_days=14)
    assert sim.end_trial(sub_id, outcome="canceled") is None
    contract = adapter(sim).fetch_subscription(sub_id)
    assert contract.status == "canceled" and contract.ended_at is not None
    assert sim.events[-1]["type"] == "customer.subscription.deleted"
    with pytest.raises(InvalidTransition):
        sim.end_trial(sub_id)


def test_end_period_renews_like_create_renewal_invoice(sim: StripeSimulator) -> None:
    _, sub_id = subscribed(sim)
    start, end = sim.get(sub_id)["current_period_start"], sim.get(sub_id)["current_period_end"]
    inv_id = sim.end_period(sub_id)
    inv = sim.get(inv_id)
    assert (inv["period_start"], inv["status"], inv["billing_reason"]) == (end, "open", "subscription_cycle")
    assert sim.get(sub_id)["current_period_start"] == end and start < end
    assert types_for(sim, inv_id) == ["invoice.created", "invoice.finalized"]


# ---------------------------------------------------------------- faults on the new routes


def test_timeout_on_delete_is_indeterminate_then_resolved(sim: StripeSimulator) -> None:
    _, sub_id = subscribed(sim)
    sim.faults.timeout("DELETE /v1/subscriptions/*", apply=True, hold_seconds=1.0)
    with pytest.raises(ProviderIndeterminate):
        adapter(sim, timeout=0.3).cancel_subscription(sub_id, idempotency_key="t")
    assert sim.get(sub_id)["status"] == "canceled"  # it happened: the indeterminate case
    assert adapter(sim).cancel_subscription(sub_id, idempotency_key="t").status == "canceled"
    assert types_for(sim, sub_id).count("customer.subscription.deleted") == 1


def test_timeout_before_apply_and_500_on_delete(sim: StripeSimulator) -> None:
    _, sub_id = subscribed(sim)
    sim.faults.timeout("DELETE /v1/subscriptions/*", apply=False, hold_seconds=0.6)
    with pytest.raises(ProviderIndeterminate):
        adapter(sim, timeout=0.2).cancel_subscription(sub_id, idempotency_key="t")
    assert sim.get(sub_id)["status"] == "active"
    sim.faults.error_500("DELETE /v1/subscriptions/*", apply=False)
    with pytest.raises(ProviderIndeterminate):
        adapter(sim).cancel_subscription(sub_id, idempotency_key="t")
    assert sim.get(sub_id)["status"] == "active"
    assert adapter(sim).cancel_subscription(sub_id, idempotency_key="t").status == "canceled"


def test_faults_reach_the_update_route(sim: StripeSimulator) -> None:
    _, sub_id = subscribed(sim)
    sim.faults.error_500("POST /v1/subscriptions/*", apply=True)
    with pytest.raises(stripe.APIError) as failed:
        sdk(sim).v1.subscriptions.update(sub_id, params={"cancel_at_period_end": True},
                                         options={"idempotency_key": "u-1"})
    assert failed.value.http_status == 500 and sim.get(sub_id)["cancel_at_period_end"] is True
    replay = sdk(sim).v1.subscriptions.update(sub_id, params={"cancel_at_period_end": True},
                                              options={"idempotency_key": "u-1"})
    assert replay.cancel_at_period_end is True
    assert replay.last_response.headers.get("Idempotent-Replayed") == "true"


# ---------------------------------------------------------------- control API


def test_control_api_drives_the_contract(sim: StripeSimulator) -> None:
    def control(path: str, body: dict[str, Any] | None = None, expect: int = 200) -> dict[str, Any]:
        status, payload = http(sim, "GET" if body is None else "POST", path, json_body=body)
        assert status == expect, payload
        return payload

    cus = control("/_sim/customers", {"email": "drill@example.com"})["id"]
    sub = control("/_sim/subscriptions", {"customer": cus, "price": "price_monthly_pro", "trial_days": 3})["id"]
    assert control(f"/_sim/subscriptions/{sub}")["subscription"]["status"] == "trialing"
    ended = control(f"/_sim/subscriptions/{sub}/end_trial", {"outcome": "active"})
    assert ended["subscription"]["status"] == "active" and ended["invoice"].startswith("in_")

    paused = control(f"/_sim/subscriptions/{sub}/pause", {"resumes_at": None})
    assert paused["subscription"]["pause_collection"] == {"behavior": "void", "resumes_at": None}
    resumed = control(f"/_sim/subscriptions/{sub}/resume", {})
    assert resumed["subscription"]["pause_collection"] is None

    priced = control(f"/_sim/subscriptions/{sub}/price", {"price": "price_yearly", "interval": "year", "amount": 9900})
    assert priced["subscription"]["items"]["data"][0]["price"]["id"] == "price_yearly"
    renewed = control(f"/_sim/subscriptions/{sub}/end_period", {})
    assert sim.get(renewed["invoice"])["price"] == "price_yearly" and sim.get(renewed["invoice"])["amount_due"] == 9900

    scheduled = control(f"/_sim/subscriptions/{sub}/cancel", {"at_period_end": True})
    assert scheduled["subscription"]["cancel_at_period_end"] is True
    final = control(f"/_sim/subscriptions/{sub}/end_period", {})
    assert final["invoice"] is None and final["subscription"]["status"] == "canceled"
    again = control(f"/_sim/subscriptions/{sub}/cancel", {}, expect=404)
    assert again["error"]["code"] == "resource_missing"
    control(f"/_sim/subscriptions/{sub}/end_trial", {"outcome": "sideways"}, expect=400)
