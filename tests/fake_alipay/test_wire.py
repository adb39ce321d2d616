"""The wire between the product's AlipayGateway and the simulator: signatures both ways, and every
way a call can fail to give a trustworthy answer (seed 003: a timeout is queried, never retried blind)."""

from __future__ import annotations

import json
import re
import time

import pytest
from Cryptodome.PublicKey import RSA

from subscriptions.providers.alipay.gateway import AlipayGateway
from subscriptions.providers.base import ProviderIndeterminate, ProviderRequestError
from tests.support.alipay import raw_gateway_call
from tests.verification.fake_alipay import generate_key_pair, verify_rsa2


@pytest.fixture(scope="module")
def stranger_key() -> str:
    return generate_key_pair()[0]


def test_the_answer_is_signed_over_the_exact_inner_json_with_alipays_key(alipay_sim):
    status, text = raw_gateway_call(alipay_sim.gateway_url, alipay_sim.app_id, alipay_sim.keys.app_private_pem,
                                    "alipay.trade.query", {"out_trade_no": "nope"})
    assert status == 200
    inner = re.search(r'^\{"alipay_trade_query_response":(\{.*?\}),"sign":"([^"]+)"\}$', text)
    assert inner, text
    assert verify_rsa2(alipay_sim.keys.alipay_public_pem, inner.group(1), inner.group(2))
    assert not verify_rsa2(alipay_sim.keys.app_public_pem, inner.group(1), inner.group(2))
    assert json.loads(inner.group(1))["sub_code"] == "ACQ.TRADE_NOT_EXIST"


def test_a_request_signed_by_another_key_is_refused_as_invalid_signature(alipay_sim, stranger_key):
    _, agreement = alipay_sim.new_agreement(5000)
    status, text = raw_gateway_call(alipay_sim.gateway_url, alipay_sim.app_id, stranger_key, "alipay.trade.pay",
                                    {"out_trade_no": "o-1", "total_amount": "1.00", "subject": "s",
                                     "product_code": "GENERAL_WITHHOLDING",
                                     "agreement_params": {"agreement_no": agreement}})
    answer = json.loads(text)["alipay_trade_pay_response"]
    assert (status, answer["code"], answer["sub_code"]) == (200, "40002", "isv.invalid-signature")
    assert alipay_sim.sim.trade_list() == []
    # Through the product's client: a signed 40002 is our fault, a definite refusal.
    with pytest.raises(ProviderRequestError, match="isv.invalid-signature"):
        alipay_sim.gateway(app_private_key_pem=stranger_key).trade_pay("o-1", agreement, 100, "s")
    assert alipay_sim.sim.trade_list() == []


def test_a_form_post_is_accepted_like_a_signed_query(alipay_sim):
    status, text = raw_gateway_call(alipay_sim.gateway_url, alipay_sim.app_id, alipay_sim.keys.app_private_pem,
                                    "alipay.user.agreement.query", {"agreement_no": "none"}, post=True)
    assert json.loads(text)["alipay_user_agreement_query_response"]["sub_code"] == "USER_AGREEMENT_NOT_EXIST"


def test_an_unknown_app_gets_an_unsigned_error_response_the_client_cannot_trust(alipay_sim):
    status, text = raw_gateway_call(alipay_sim.gateway_url, "2021999999999999", alipay_sim.keys.app_private_pem,
                                    "alipay.trade.query", {"out_trade_no": "x"})
    body = json.loads(text)
    assert "sign" not in body
    assert body["error_response"]["sub_code"] == "isv.invalid-app-id"
    with pytest.raises(ProviderIndeterminate, match="unsigned"):
        alipay_sim.gateway(app_id="2021999999999999").trade_query("x")


def test_a_wrong_sign_type_is_refused(alipay_sim):
    _, text = raw_gateway_call(alipay_sim.gateway_url, alipay_sim.app_id, alipay_sim.keys.app_private_pem,
                               "alipay.trade.query", {"out_trade_no": "x"}, sign_type="RSA")
    assert json.loads(text)["alipay_trade_query_response"]["sub_code"] == "isv.invalid-signature-type"


def test_a_tampered_answer_is_refused_as_indeterminate(alipay_sim):
    _, agreement = alipay_sim.new_agreement(5000)
    alipay_sim.sim.faults.arm("tamper", "alipay.trade.pay")
    with pytest.raises(ProviderIndeterminate, match="signature"):
        alipay_sim.gateway().trade_pay("o-t", agreement, 100, "s")
    # The charge happened; only the answer was altered: the query tells the truth.
    assert alipay_sim.gateway().trade_query("o-t").body["trade_status"] == "TRADE_SUCCESS"


def test_an_answer_signed_by_another_alipay_key_is_refused(alipay_sim, stranger_key):
    stranger_public = RSA.import_key(stranger_key).publickey().export_key().decode()
    with pytest.raises(ProviderIndeterminate, match="signature"):
        alipay_sim.gateway(alipay_public_key_pem=stranger_public).trade_query("x")


def test_a_timeout_where_nothing_happened_is_indeterminate_and_the_query_finds_no_trade(alipay_sim):
    user, agreement = alipay_sim.new_agreement(5000)
    alipay_sim.sim.faults.arm("timeout", "alipay.trade.pay", apply=False, hold_seconds=1.0)
    started = time.monotonic()
    with pytest.raises(ProviderIndeterminate, match="timeout"):
        alipay_sim.gateway(timeout_seconds=0.3).trade_pay("o-1", agreement, 1000, "s")
    assert time.monotonic() - started < 0.9
    assert alipay_sim.gateway().trade_query("o-1").sub_code == "ACQ.TRADE_NOT_EXIST"
    assert alipay_sim.sim.balance(user) == 5000


def test_a_timeout_that_charged_is_indeterminate_and_the_query_shows_success(alipay_sim):
    user, agreement = alipay_sim.new_agreement(5000)
    alipay_sim.sim.faults.arm("timeout", "alipay.trade.pay", apply=True, hold_seconds=1.0)
    gateway = alipay_sim.gateway(timeout_seconds=0.3)
    with pytest.raises(ProviderIndeterminate, match="timeout"):
        gateway.trade_pay("o-1", agreement, 1000, "s")
    query = alipay_sim.gateway().trade_query("o-1")
    assert (query.code, query.body["trade_status"], query.body["total_amount"]) == ("10000", "TRADE_SUCCESS", "10.00")
    assert alipay_sim.sim.balance(user) == 4000
    # Paying the same order again cannot charge twice.
    assert alipay_sim.gateway().trade_pay("o-1", agreement, 1000, "s").sub_code == "ACQ.TRADE_HAS_SUCCESS"
    assert alipay_sim.sim.balance(user) == 4000


def test_http_502_is_indeterminate(alipay_sim):
    alipay_sim.sim.faults.arm("http_502", "alipay.trade.query")
    with pytest.raises(ProviderIndeterminate, match="HTTP 502"):
        alipay_sim.gateway().trade_query("x")
    assert alipay_sim.gateway().trade_query("x").sub_code == "ACQ.TRADE_NOT_EXIST"  # one call only


def test_a_signed_system_error_is_returned_for_the_adapter_to_judge(alipay_sim):
    _, agreement = alipay_sim.new_agreement(5000)
    alipay_sim.sim.faults.arm("system_error", "alipay.trade.pay")
    answer = alipay_sim.gateway().trade_pay("o-1", agreement, 100, "s")
    assert (answer.code, answer.sub_code) == ("20000", "ACQ.SYSTEM_ERROR")
    assert '"alipay_trade_pay_response"' in answer.raw_text


def test_a_closed_port_is_indeterminate(alipay_keys):
    gateway = AlipayGateway("2021000000000001", alipay_keys.app_private_pem, alipay_keys.alipay_public_pem,
                            "http://127.0.0.1:9/gateway.do", "", 0.5)
    with pytest.raises(ProviderIndeterminate, match="URLError|refused"):
        gateway.trade_query("x")
