"""/webhooks/alipay/ refuses what it cannot trust (seed 003: verify the signature first, then the
merchant, the order, the amount and the currency): each refusal answers Alipay's failure (`fail`,
a 4xx), keeps the raw request, and changes no access."""

from __future__ import annotations

from datetime import timedelta
from urllib.parse import urlencode

import pytest

from dunning.jobs.framework import job_run
from dunning.models import ProviderEvent, WebhookDelivery
from subscriptions.models import AlipayTrade, Subscription
from tests.verification.fake_alipay import sign_rsa2, signing_string


def _signed(alipay, **fields: str) -> bytes:
    form = {"notify_id": "n-hostile-1", "notify_time": "2026-12-03 18:00:00", "notify_type": "trade_status_sync",
            "app_id": "2021000000000001", "charset": "utf-8", "version": "1.0", **fields}
    form["sign"] = sign_rsa2(alipay.handle.keys.alipay_private_pem, signing_string(form, exclude=("sign", "sign_type")))
    form["sign_type"] = "RSA2"
    return urlencode(form).encode()


@pytest.fixture
def paid_trade(alipay, time_machine) -> AlipayTrade:
    sub = alipay.sign_up(balance_fen=10_000)
    time_machine.move_to(sub.current_period_end + timedelta(minutes=1), tick=True)
    job_run("alipay_renewals")
    return AlipayTrade.objects.select_related("order").get(order__agreement__agreement_no=sub.provider_subscription_id)


def _refused(alipay, body: bytes, code: str, *, content_type: str | None = None) -> WebhookDelivery:
    before = list(Subscription.objects.values_list("pk", "entitlement_generation", "entitlement_profile"))
    response = alipay.post(body, **({"content_type": content_type} if content_type else {}))
    assert response.status_code == 400 and response.content == b"fail"
    delivery = WebhookDelivery.objects.filter(provider="alipay").latest("pk")
    assert delivery.rejection_reason == code and delivery.http_status == 400
    assert delivery.body_size == len(body), "the raw request is kept"
    after = list(Subscription.objects.values_list("pk", "entitlement_generation", "entitlement_profile"))
    assert after == before, "no access changed"
    return delivery


def test_a_bad_signature_is_refused_and_kept(alipay, paid_trade):
    body = _signed(alipay, out_trade_no=paid_trade.out_trade_no, trade_status="TRADE_SUCCESS", total_amount="30.00")
    tampered = body.replace(b"total_amount=30.00", b"total_amount=31.00")
    delivery = _refused(alipay, tampered, "SIGNATURE_MISMATCH")
    assert delivery.verification == "REJECTED"
    assert not ProviderEvent.objects.filter(provider="alipay", event_id="n-hostile-1").exists()


def test_a_form_signed_by_another_key_is_refused(alipay, paid_trade, alipay_keys):
    form = {"notify_id": "n-2", "notify_time": "2026-12-03 18:00:00", "notify_type": "trade_status_sync",
            "app_id": "2021000000000001", "out_trade_no": paid_trade.out_trade_no, "trade_status": "TRADE_SUCCESS",
            "total_amount": "30.00"}
    form["sign"] = sign_rsa2(alipay_keys.app_private_pem, signing_string(form))  # our own key, not Alipay's
    form["sign_type"] = "RSA2"
    _refused(alipay, urlencode(form).encode(), "SIGNATURE_MISMATCH")


@pytest.mark.parametrize(("fields", "code"), [
    ({"app_id": "2021999999999999"}, "UNKNOWN_APP_ID"),
    ({"total_amount": "0.01"}, "AMOUNT_MISMATCH"),
    ({"total_amount": "30.001"}, "AMOUNT_MISMATCH"),
    ({"trans_currency": "USD"}, "CURRENCY_MISMATCH"),
    ({"out_trade_no": "RN20261203NEVERSENT"}, "UNKNOWN_OUT_TRADE_NO"),
])
def test_a_verified_notification_that_does_not_match_what_we_sent_is_quarantined(alipay, paid_trade, fields, code):
    base = {"out_trade_no": paid_trade.out_trade_no, "trade_status": "TRADE_SUCCESS", "total_amount": "30.00"}
    delivery = _refused(alipay, _signed(alipay, **{**base, **fields}), code)
    event = ProviderEvent.objects.get(provider="alipay", event_id="n-hostile-1")
    assert delivery.verification == "VERIFIED" and delivery.event == event
    assert event.outcome == "QUARANTINED" and event.outcome_detail.startswith(f"at intake: {code}")
    # Alipay delivers it again: written once, refused the same way.
    _refused(alipay, _signed(alipay, **{**base, **fields}), code)
    assert ProviderEvent.objects.filter(provider="alipay", event_id="n-hostile-1").count() == 1


@pytest.mark.parametrize("body", [
    b"", b"notify_id=1&&&", b"\xff\xfe", b"a=1&a=2", b"notify_id=%00&sign=x", b"{\"json\": true}",
    b"x=" + b"y" * 5000,
])
def test_a_malformed_form_body_is_refused(alipay, body):
    response = alipay.post(body)
    assert response.status_code == 400 and response.content == b"fail"
    assert WebhookDelivery.objects.filter(provider="alipay").latest("pk").verification == "REJECTED"


def test_a_signed_form_missing_its_fields_is_refused(alipay):
    _refused(alipay, _signed(alipay, trade_status="TRADE_SUCCESS"), "MALFORMED_PAYLOAD")


def test_an_unknown_provider_route_is_a_404(client):
    assert client.post("/webhooks/paypal/", data=b"x", content_type="text/plain").status_code == 404
