"""Withholding under an agreement, through the product's AlipayGateway against the simulator."""

from __future__ import annotations

import json

import pytest

from subscriptions.providers.base import ProviderRequestError
from tests.support.alipay import raw_gateway_call
from tests.verification.fake_alipay import BALANCE_NOT_ENOUGH


def test_pay_success_debits_the_balance_once_and_answers_like_alipay(alipay_sim):
    user, agreement = alipay_sim.new_agreement(5000)
    answer = alipay_sim.gateway().trade_pay("renewal-1-a1", agreement, 1234, "Pro plan, March")
    assert answer.ok and answer.code == "10000" and answer.msg == "Success"
    body = answer.body
    assert (body["out_trade_no"], body["total_amount"], body["receipt_amount"]) == ("renewal-1-a1", "12.34", "12.34")
    assert len(body["trade_no"]) == 28 and body["trade_no"].isdigit()
    assert body["buyer_user_id"] == user and body["gmt_payment"]
    assert alipay_sim.sim.balance(user) == 5000 - 1234
    [trade] = alipay_sim.sim.trade_list()
    assert trade["trade_status"] == "TRADE_SUCCESS" and trade["notify_url"] == alipay_sim.receiver.url


def test_balance_not_enough_closes_the_trade_and_the_same_order_cannot_be_paid_again(alipay_sim):
    user, agreement = alipay_sim.new_agreement(500)
    gateway = alipay_sim.gateway()
    answer = gateway.trade_pay("o-1", agreement, 1000, "s")
    assert (answer.code, answer.sub_code) == ("40004", BALANCE_NOT_ENOUGH)
    assert gateway.trade_query("o-1").body["trade_status"] == "TRADE_CLOSED"
    alipay_sim.sim.set_balance(user, 5000)
    assert gateway.trade_pay("o-1", agreement, 1000, "s").sub_code == "ACQ.TRADE_HAS_CLOSE"
    assert gateway.trade_pay("o-2", agreement, 1000, "s").ok  # a new attempt needs a new out_trade_no
    assert alipay_sim.sim.balance(user) == 4000


def test_same_out_trade_no_after_success_is_trade_has_success_without_a_second_charge(alipay_sim):
    user, agreement = alipay_sim.new_agreement(5000)
    gateway = alipay_sim.gateway()
    assert gateway.trade_pay("o-1", agreement, 1000, "s").ok
    again = gateway.trade_pay("o-1", agreement, 1000, "s")
    assert (again.code, again.sub_code) == ("40004", "ACQ.TRADE_HAS_SUCCESS")
    assert alipay_sim.sim.balance(user) == 4000
    assert len(alipay_sim.sim.trade_list()) == 1


def test_a_revoked_agreement_is_invalid_and_an_unknown_one_does_not_exist(alipay_sim):
    user, agreement = alipay_sim.new_agreement(5000)
    alipay_sim.sim.revoke_agreement(agreement)
    gateway = alipay_sim.gateway()
    assert gateway.trade_pay("o-1", agreement, 100, "s").sub_code == "ACQ.AGREEMENT_INVALID"
    assert gateway.trade_pay("o-2", "20990101000000000000", 100, "s").sub_code == "ACQ.AGREEMENT_NOT_EXIST"
    assert alipay_sim.sim.balance(user) == 5000
    assert alipay_sim.sim.trade_list() == []


@pytest.mark.parametrize("amount", ["12.345", "-1.00", "1e3", "0.00", "abc", "", "100000000.01"])
def test_an_amount_that_is_not_a_yuan_amount_is_an_invalid_parameter(alipay_sim, amount):
    user, agreement = alipay_sim.new_agreement(5000)
    _, text = raw_gateway_call(alipay_sim.gateway_url, alipay_sim.app_id, alipay_sim.keys.app_private_pem,
                               "alipay.trade.pay", {"out_trade_no": "o-1", "total_amount": amount, "subject": "s",
                                                    "product_code": "GENERAL_WITHHOLDING",
                                                    "agreement_params": {"agreement_no": agreement}})
    answer = json.loads(text)["alipay_trade_pay_response"]
    assert (answer["code"], answer["sub_code"]) == ("40004", "ACQ.INVALID_PARAMETER")
    assert alipay_sim.sim.balance(user) == 5000


def test_a_missing_out_trade_no_is_a_signed_40002_which_the_client_raises(alipay_sim):
    _, agreement = alipay_sim.new_agreement(5000)
    with pytest.raises(ProviderRequestError, match="isv.missing-parameter"):
        alipay_sim.gateway().trade_pay("", agreement, 100, "s")


def test_query_of_each_state(alipay_sim):
    user, agreement = alipay_sim.new_agreement(1500)
    sim, gateway = alipay_sim.sim, alipay_sim.gateway()
    assert gateway.trade_query("missing").sub_code == "ACQ.TRADE_NOT_EXIST"
    assert gateway.trade_pay("paid", agreement, 1000, "s").ok
    sim.faults.arm("in_progress", "alipay.trade.pay")
    waiting = gateway.trade_pay("waiting", agreement, 100, "s")
    assert waiting.code == "10003"
    assert gateway.trade_pay("closed", agreement, 9900, "s").sub_code == BALANCE_NOT_ENOUGH
    states = {no: gateway.trade_query(no).body for no in ("paid", "waiting", "closed")}
    assert {no: b["trade_status"] for no, b in states.items()} == {
        "paid": "TRADE_SUCCESS", "waiting": "WAIT_BUYER_PAY", "closed": "TRADE_CLOSED"}
    assert states["paid"]["send_pay_date"] and "send_pay_date" not in states["closed"]
    assert states["paid"]["total_amount"] == "10.00" and states["paid"]["buyer_user_id"] == user
    sim.settle_trade(alipay_sim.app_id, "waiting", success=True)
    assert gateway.trade_query("waiting").body["trade_status"] == "TRADE_SUCCESS"
    sim.finish_trade(alipay_sim.app_id, "paid")
    assert gateway.trade_query("paid").body["trade_status"] == "TRADE_FINISHED"
    assert sim.balance(user) == 1500 - 1000 - 100


def test_agreement_query_and_unsign(alipay_sim):
    user, agreement = alipay_sim.new_agreement(100, external_agreement_no="contract-7")
    gateway = alipay_sim.gateway()
    body = gateway.agreement_query(agreement).body
    assert (body["status"], body["external_agreement_no"], body["alipay_user_id"]) == ("NORMAL", "contract-7", user)
    assert body["personal_product_code"] == "CYCLE_PAY_AUTH_P" and body["invalid_time"] == "2115-02-01 00:00:00"
    assert gateway.agreement_unsign(agreement).ok
    after = gateway.agreement_query(agreement).body
    assert after["status"] == "UNSIGN" and after["invalid_time"] != "2115-02-01 00:00:00"
    assert gateway.agreement_query("20990101000000000000").sub_code == "USER_AGREEMENT_NOT_EXIST"
    assert gateway.trade_pay("o-1", agreement, 100, "s").sub_code == "ACQ.AGREEMENT_INVALID"


def test_another_apps_agreement_does_not_exist_for_this_app(alipay_sim, alipay_keys):
    sim = alipay_sim.sim
    sim.register_app("2021000000000002", alipay_keys.app_public_pem, alipay_sim.receiver.url)
    user = sim.create_user(5000)
    theirs = sim.sign_agreement("2021000000000002", user, "x")
    assert alipay_sim.gateway().trade_pay("o-1", theirs, 100, "s").sub_code == "ACQ.AGREEMENT_NOT_EXIST"
    assert alipay_sim.gateway().agreement_query(theirs).sub_code == "USER_AGREEMENT_NOT_EXIST"
