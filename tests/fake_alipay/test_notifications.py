"""Asynchronous notifications: signed with Alipay's key, verifiable by the product's
verify_notification, retried on Alipay's schedule with one notify_id until the answer is ``success``."""

from __future__ import annotations

import pytest

from tests.verification.fake_alipay import MAX_DELIVERIES, RETRY_DELAYS

# Alipay's documented schedule after a failed delivery (written out: the simulator's constant is under test).
ALIPAY_SCHEDULE = (4 * 60, 10 * 60, 10 * 60, 3600, 2 * 3600, 6 * 3600, 15 * 3600)


def _paid(alipay_sim, balance=5000, amount=1000, out_trade_no="o-1"):
    _, agreement = alipay_sim.new_agreement(balance)
    answer = alipay_sim.gateway().trade_pay(out_trade_no, agreement, amount, "会员续费")
    return agreement, answer


def test_a_success_notification_is_signed_and_verifies_with_the_product_client(alipay_sim):
    agreement, answer = _paid(alipay_sim)
    alipay_sim.sim.deliver_due()
    [sign_notice] = alipay_sim.receiver.forms("dut_user_sign")
    [form] = alipay_sim.receiver.forms("trade_status_sync")
    gateway = alipay_sim.gateway()
    assert gateway.verify_notification(form) and gateway.verify_notification(sign_notice)
    assert (form["trade_status"], form["out_trade_no"], form["trade_no"]) == ("TRADE_SUCCESS", "o-1",
                                                                             answer.body["trade_no"])
    assert (form["total_amount"], form["receipt_amount"], form["app_id"]) == ("10.00", "10.00", alipay_sim.app_id)
    assert form["sign_type"] == "RSA2" and form["charset"] == "utf-8" and form["version"] == "1.0"
    assert form["subject"] == "会员续费" and form["gmt_payment"] and form["seller_id"].startswith("2088")
    assert sign_notice["agreement_no"] == agreement and sign_notice["status"] == "NORMAL"
    # One changed value and the signature no longer holds.
    assert not gateway.verify_notification({**form, "total_amount": "1000.00"})
    assert not gateway.verify_notification({**form, "sign_type": "RSA"})
    assert alipay_sim.receiver.received[0].content_type.startswith("application/x-www-form-urlencoded")


def test_a_closed_trade_is_notified_too(alipay_sim):
    _paid(alipay_sim, balance=10, amount=1000)
    alipay_sim.sim.deliver_due()
    [form] = alipay_sim.receiver.forms("trade_status_sync")
    assert form["trade_status"] == "TRADE_CLOSED" and "gmt_payment" not in form and form["gmt_close"]
    assert alipay_sim.gateway().verify_notification(form)


def test_the_notify_url_of_the_pay_call_wins_over_the_apps(alipay_sim):
    _, agreement = alipay_sim.new_agreement(5000)
    alipay_sim.gateway(notify_url=alipay_sim.receiver.url + "per-call/").trade_pay("o-1", agreement, 100, "s")
    alipay_sim.sim.deliver_due()
    assert [n.path for n in alipay_sim.receiver.received] == ["/notify/alipay/", "/notify/alipay/per-call/"]


def test_retries_follow_alipays_schedule_with_the_same_notify_id_until_success(alipay_sim):
    sim, receiver = alipay_sim.sim, alipay_sim.receiver
    _, agreement = alipay_sim.new_agreement(5000)
    sim.deliver_due()  # the agreement notice, acknowledged
    alipay_sim.gateway().trade_pay("o-2", agreement, 1000, "s")
    receiver.answer_with("fail", (500, "success"), "SUCCESS", "success ")  # none of these is `success`
    first = [d for d in sim.deliver_due() if d.notify_type == "trade_status_sync"]
    assert len(first) == 1 and not first[0].ok
    notify_id = first[0].notify_id
    assert RETRY_DELAYS == ALIPAY_SCHEDULE
    for delay in ALIPAY_SCHEDULE[:4]:
        sim.advance(delay - 1)
        assert [d for d in sim.deliver_due() if d.notify_type == "trade_status_sync"] == []  # not yet due
        sim.advance(1)
        assert len(sim.deliver_due()) == 1
    log = sim.delivery_log(notify_id)
    assert [d.attempt for d in log] == [1, 2, 3, 4, 5] and [d.ok for d in log] == [False] * 4 + [True]
    assert {r.form["notify_id"] for r in receiver.received if r.form.get("out_trade_no") == "o-2"} == {notify_id}
    sim.advance(24 * 3600)
    assert sim.deliver_due() == []  # acknowledged: never sent again


def test_a_receiver_that_never_says_success_gets_eight_deliveries(alipay_sim):
    sim, receiver = alipay_sim.sim, alipay_sim.receiver
    receiver.default_answer = (200, "fail")
    _paid(alipay_sim)
    for _ in range(20):
        sim.deliver_due()
        sim.advance(15 * 3600)
    counts = {}
    for d in sim.delivery_log():
        counts[d.notify_type] = counts.get(d.notify_type, 0) + 1
    assert counts == {"dut_user_sign": MAX_DELIVERIES, "trade_status_sync": MAX_DELIVERIES} == {
        "dut_user_sign": 8, "trade_status_sync": 8}


def test_a_connection_error_is_retried(alipay_sim):
    sim = alipay_sim.sim
    alipay_sim.receiver.stop()
    _paid(alipay_sim)
    [d1, d2] = sim.deliver_due()
    assert d1.status is None and "URLError" in (d1.error or "")
    sim.advance(ALIPAY_SCHEDULE[0] - 1)
    assert sim.deliver_due() == []
    sim.advance(1)
    assert len(sim.deliver_due()) == 2


def test_duplicated_notifications_arrive_twice_with_one_notify_id(alipay_sim):
    sim = alipay_sim.sim
    _, agreement = alipay_sim.new_agreement(5000)
    sim.deliver_due()
    sim.faults.duplicate_notifications(1)
    alipay_sim.gateway().trade_pay("o-1", agreement, 100, "s")
    sim.deliver_due()
    forms = alipay_sim.receiver.forms("trade_status_sync")
    assert len(forms) == 2 and forms[0]["notify_id"] == forms[1]["notify_id"]
    assert all(alipay_sim.gateway().verify_notification(f) for f in forms)


def test_delayed_and_dropped_notifications(alipay_sim):
    sim = alipay_sim.sim
    _, agreement = alipay_sim.new_agreement(5000)
    sim.deliver_due()
    sim.faults.delay_notifications(600, count=1)
    alipay_sim.gateway().trade_pay("late", agreement, 100, "s")
    sim.faults.drop_notifications(1)
    alipay_sim.gateway().trade_pay("lost", agreement, 100, "s")
    assert sim.deliver_due() == []
    sim.advance(600)
    sim.advance(24 * 3600)
    sim.deliver_due()
    assert [f["out_trade_no"] for f in alipay_sim.receiver.forms("trade_status_sync")] == ["late"]
    dropped = [d for d in sim.delivery_log() if d.error == "dropped by fault"]
    assert len(dropped) == 1
    # The dropped one is still known to the query: the product must reconcile by querying.
    assert alipay_sim.gateway().trade_query("lost").body["trade_status"] == "TRADE_SUCCESS"


def test_revoking_sends_dut_user_unsign(alipay_sim):
    _, agreement = alipay_sim.new_agreement(5000)
    alipay_sim.sim.revoke_agreement(agreement)
    alipay_sim.sim.deliver_due()
    [form] = alipay_sim.receiver.forms("dut_user_unsign")
    assert (form["agreement_no"], form["status"]) == (agreement, "UNSIGN") and form["unsign_time"]
    assert form["personal_product_code"] == "CYCLE_PAY_AUTH_P" and alipay_sim.gateway().verify_notification(form)


@pytest.mark.parametrize("garbage", [
    {}, {"sign": "", "sign_type": "RSA2"}, {"sign": "%%%not base64%%%", "sign_type": "RSA2", "a": "b"},
    {"sign": "QUJD", "sign_type": "RSA2", "a": "b"}, {"sign": "QUJD", "a": "b"}, {"sign": None, "sign_type": "RSA2"},
    {"sign": "QUJD", "sign_type": "RSA2", "a": 3}, "not a dict",
])
def test_verify_notification_never_raises_on_garbage(alipay_sim, garbage):
    assert alipay_sim.gateway().verify_notification(garbage) is False


def test_the_background_pump_delivers_without_a_control_call(alipay_sim):
    alipay_sim.sim.start_pump(0.05)
    _paid(alipay_sim)
    received = alipay_sim.receiver.wait_for(2)
    assert {r.form["notify_type"] for r in received} == {"dut_user_sign", "trade_status_sync"}
