"""The trade bill (GBK CSV in a zip, parsed by the product into BillRow) and the JSON control API."""

from __future__ import annotations

import io
import json
import urllib.error
import urllib.request
import zipfile

import pytest

from subscriptions.providers.base import ProviderNotFound
from tests.verification.fake_alipay.state import shanghai


def test_the_days_bill_lists_the_successful_trades_of_that_day_only(alipay_sim):
    sim, gateway = alipay_sim.sim, alipay_sim.gateway()
    _, agreement = alipay_sim.new_agreement(10_000)
    day = shanghai(sim.now()).date()
    assert gateway.trade_pay("day1-a", agreement, 1234, "会员续费 三月").ok
    assert gateway.trade_pay("day1-b", agreement, 99_999, "too much").sub_code  # closed: not in the bill
    assert gateway.trade_pay("day1-c", agreement, 1, "一分钱").ok
    with pytest.raises(ProviderNotFound, match="bill_not_exist"):
        gateway.bill_rows(day)  # today's bill does not exist yet
    sim.advance(86_400)
    assert gateway.trade_pay("day2-a", agreement, 500, "next day").ok
    rows = gateway.bill_rows(day)
    assert [(r.out_trade_no, r.amount_fen, r.subject, r.status, r.business_type) for r in rows] == [
        ("day1-a", 1234, "会员续费 三月", "TRADE_SUCCESS", "交易"), ("day1-c", 1, "一分钱", "TRADE_SUCCESS", "交易")]
    trades = {t["out_trade_no"]: t for t in sim.trade_list()}
    assert rows[0].trade_no == trades["day1-a"]["trade_no"] and len(rows[0].trade_no) == 28
    assert rows[0].finished_at and rows[0].finished_at.date() == day and rows[0].finished_at.utcoffset()
    sim.advance(86_400)
    assert [r.out_trade_no for r in gateway.bill_rows(shanghai(sim.now() - 86_400).date())] == ["day2-a"]


def test_the_bill_zip_is_gbk_with_gbk_file_names_like_alipays(alipay_sim):
    sim, gateway = alipay_sim.sim, alipay_sim.gateway()
    day = shanghai(sim.now()).date()
    sim.advance(86_400)
    url = gateway.bill_download_url(day).body["bill_download_url"]
    assert url.startswith(sim.base_url)
    content = urllib.request.urlopen(url, timeout=5).read()
    with zipfile.ZipFile(io.BytesIO(content)) as archive:
        infos = archive.infolist()
        assert all(not i.flag_bits & 0x800 for i in infos)  # no UTF-8 flag: names are GBK
        names = [i.filename.encode("cp437").decode("gbk") for i in infos]
        assert any(n.endswith("_业务明细.csv") for n in names) and any("汇总" in n for n in names)
        text = archive.read(infos[0]).decode("gbk")
    assert text.startswith("#支付宝业务明细查询") and "支付宝交易号,商户订单号,业务类型" in text
    assert gateway.bill_rows(day) == []


def _control(sim, method, path, body=None):
    request = urllib.request.Request(f"{sim.base_url}/_control/{path}", method=method,
                                     data=json.dumps(body).encode() if body is not None else None)
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


def test_the_control_api_drives_a_whole_renewal_over_http(alipay_sim, alipay_keys):
    sim = alipay_sim.sim
    app = _control(sim, "POST", "apps", {"app_id": "2021000000000009", "public_key_pem": alipay_keys.app_public_pem,
                                         "notify_url": alipay_sim.receiver.url})
    assert app["alipay_public_key_pem"] == alipay_keys.alipay_public_pem
    user = _control(sim, "POST", "users", {"balance_fen": 100})["user_id"]
    agreement = _control(sim, "POST", "agreements", {"app_id": "2021000000000009", "user_id": user,
                                                     "external_agreement_no": "c-1"})
    assert agreement["status"] == "NORMAL"
    gateway = alipay_sim.gateway(app_id="2021000000000009")
    assert gateway.trade_pay("o-1", agreement["agreement_no"], 500, "s").sub_code == "ACQ.BUYER_BALANCE_NOT_ENOUGH"
    assert _control(sim, "POST", f"users/{user}/balance", {"balance_fen": 1000})["balance_fen"] == 1000
    _control(sim, "POST", "faults", {"kind": "timeout", "method": "alipay.trade.pay", "apply": True,
                                     "hold_seconds": 0.8})
    with pytest.raises(Exception, match="timeout"):
        alipay_sim.gateway(app_id="2021000000000009", timeout_seconds=0.3).trade_pay(
            "o-2", agreement["agreement_no"], 500, "s")
    trades = {t["out_trade_no"]: t["trade_status"] for t in _control(sim, "GET", "trades")["trades"]}
    assert trades == {"o-1": "TRADE_CLOSED", "o-2": "TRADE_SUCCESS"}
    alipay_sim.receiver.answer_with("nope")
    delivered = _control(sim, "POST", "deliver_due", {})["deliveries"]
    assert [d["ok"] for d in delivered] == [False, True, True]
    before = _control(sim, "GET", "clock")["now"]
    assert _control(sim, "POST", "clock/advance", {"seconds": 240})["now"] >= before + 240
    assert [d["ok"] for d in _control(sim, "POST", "deliver_due", {})["deliveries"]] == [True]
    assert len(_control(sim, "GET", "deliveries")["deliveries"]) == 4
    revoked = _control(sim, "POST", f"agreements/{agreement['agreement_no']}/revoke", {})
    assert revoked["status"] == "UNSIGN"
    assert _control(sim, "GET", "notifications")["notifications"][-1]["notify_type"] == "dut_user_unsign"


def test_the_control_api_refuses_bad_requests(alipay_sim):
    with pytest.raises(urllib.error.HTTPError) as bad:
        _control(alipay_sim.sim, "POST", "faults", {"kind": "meteor"})
    assert bad.value.code == 400
    with pytest.raises(urllib.error.HTTPError) as missing:
        _control(alipay_sim.sim, "GET", "nothing-here")
    assert missing.value.code == 404
