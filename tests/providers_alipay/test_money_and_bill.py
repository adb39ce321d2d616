"""subscriptions.providers.alipay without the network: yuan/fen conversion and the bill parser."""

from __future__ import annotations

import io
import zipfile
from datetime import datetime

import pytest

from subscriptions.providers.alipay.gateway import SHANGHAI, parse_bill_csv, parse_bill_zip
from subscriptions.providers.alipay.money import fen_to_yuan, yuan_to_fen


@pytest.mark.parametrize(("text", "fen"), [
    ("0", 0), ("0.01", 1), ("0.1", 10), ("1", 100), ("12.34", 1234), ("12.3", 1230), ("100000000.00", 10_000_000_000),
    ("99999999999999999999.99", 9_999_999_999_999_999_999_999),
])
def test_yuan_to_fen_is_exact(text, fen):
    assert yuan_to_fen(text) == fen


@pytest.mark.parametrize("text", [
    "", " 1", "1 ", "-1", "-0.01", "+1", "1e3", "1E-2", "NaN", "nan", "Infinity", "1.234", "1.", ".5", "01",
    "1,00", "１２", "0x10", "1_000", "1.2.3", None, 12, 12.34,
])
def test_yuan_to_fen_refuses_anything_else(text):
    with pytest.raises(ValueError):
        yuan_to_fen(text)


@pytest.mark.parametrize(("fen", "text"), [(0, "0.00"), (1, "0.01"), (10, "0.10"), (1234, "12.34"), (100, "1.00"),
                                           (10_000_000_000, "100000000.00")])
def test_fen_to_yuan(fen, text):
    assert fen_to_yuan(fen) == text
    assert yuan_to_fen(fen_to_yuan(fen)) == fen


@pytest.mark.parametrize("fen", [-1, 1.5, "12", True, None])
def test_fen_to_yuan_refuses_what_is_not_a_whole_non_negative_number(fen):
    with pytest.raises(ValueError):
        fen_to_yuan(fen)


BILL = """#支付宝业务明细查询
#账号：[20880000000000010156]
#起始日期：[2026年03月01日 00:00:00]   终止日期：[2026年03月02日 00:00:00]
#-----------------------------------------业务明细列表----------------------------------------
支付宝交易号,商户订单号,业务类型,商品名称,创建时间,完成时间,门店编号,门店名称,操作员,终端号,对方账户,订单金额（元）,商家实收（元）
2026030122001000000000000001\t,renewal-1\t,交易,"会员, 三",2026-03-01 10:00:00,2026-03-01 10:00:01,,,,,x@y,12.34,12.34
2026030122001000000000000002\t,renewal-2\t,退款,会员,2026-02-01 10:00:00,2026-03-01 11:00:00,,,,,x@y,-5.00,-5.00
#-----------------------------------------业务明细列表结束------------------------------------
#交易合计：1笔，商家实收共12.34元，商家优惠共0.00元
#导出时间：[2026年03月02日 09:00:00]
"""


def test_the_bill_parser_skips_hash_lines_strips_tab_padding_and_reads_refunds():
    rows = parse_bill_csv(BILL)
    assert [(r.trade_no, r.out_trade_no, r.subject, r.amount_fen, r.status) for r in rows] == [
        ("2026030122001000000000000001", "renewal-1", "会员, 三", 1234, "TRADE_SUCCESS"),
        ("2026030122001000000000000002", "renewal-2", "会员", -500, "REFUND")]
    assert rows[0].finished_at == datetime(2026, 3, 1, 10, 0, 1, tzinfo=SHANGHAI)


def test_the_bill_parser_refuses_a_file_without_the_columns_it_needs():
    with pytest.raises(ValueError, match="header"):
        parse_bill_csv("#x\na,b,c\n1,2,3\n")
    with pytest.raises(ValueError):
        parse_bill_csv(BILL.replace("12.34,12.34", "12.345,12.34"))


def test_the_zip_parser_reads_the_detail_file_not_the_summary():
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("2088_20260301_业务明细(汇总).csv", "#summary\n".encode("gbk"))
        archive.writestr("2088_20260301_业务明细.csv", BILL.encode("gbk"))
    assert [r.out_trade_no for r in parse_bill_zip(buffer.getvalue())] == ["renewal-1", "renewal-2"]
