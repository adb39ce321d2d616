"""The daily trade bill as Alipay serves it: a zip holding two GBK CSV files (the detail list and a
summary), named in GBK without the zip UTF-8 flag, the detail list framed by ``#`` lines."""

from __future__ import annotations

import csv
import io
import zipfile
from datetime import date

from tests.verification.fake_alipay.state import Trade, alipay_time, yuan

HEADER = ["支付宝交易号", "商户订单号", "业务类型", "商品名称", "创建时间", "完成时间", "门店编号", "门店名称",
          "操作员", "终端号", "对方账户", "订单金额（元）", "商家实收（元）", "支付宝红包（元）", "集分宝（元）",
          "支付宝优惠（元）", "商家优惠（元）", "券核销金额（元）", "券名称", "商家红包消费金额（元）",
          "卡消费金额（元）", "退款批次号/请求号", "服务费（元）", "分润（元）", "备注"]


class _GbkName(zipfile.ZipInfo):
    """Alipay's zips carry GBK file names without the UTF-8 flag; zipfile would write UTF-8."""

    def _encodeFilenameFlags(self) -> tuple[bytes, int]:  # noqa: N802 - zipfile's own name
        return self.filename.encode("gbk"), self.flag_bits & ~0x800


def detail_csv(seller_id: str, day: date, trades: list[Trade], exported_at: float) -> str:
    out = io.StringIO()
    out.write("#支付宝业务明细查询\n")
    out.write(f"#账号：[{seller_id}0156]\n")
    out.write(f"#起始日期：[{day:%Y年%m月%d日} 00:00:00]   终止日期：[{day:%Y年%m月%d日} 23:59:59]\n")
    out.write("#-----------------------------------------业务明细列表----------------------------------------\n")
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(HEADER)
    total = 0
    for t in sorted(trades, key=lambda t: t.paid_at or 0):
        total += t.amount_fen
        amount = yuan(t.amount_fen)
        # Alipay pads the id columns with a tab so spreadsheets keep them as text.
        writer.writerow([f"{t.trade_no}\t", f"{t.out_trade_no}\t", "交易", t.subject, alipay_time(t.created_at),
                         alipay_time(t.paid_at or t.created_at), "", "", "", "", f"{t.user_id[:4]}****@example.com",
                         amount, amount, "0.00", "0.00", "0.00", "0.00", "0.00", "", "0.00", "0.00", "", "0.00",
                         "0.00", ""])
    out.write("#-----------------------------------------业务明细列表结束------------------------------------\n")
    out.write(f"#交易合计：{len(trades)}笔，商家实收共{yuan(total)}元，商家优惠共0.00元\n")
    out.write("#退款合计：0笔，商家实收退款共0.00元，商家优惠退款共0.00元\n")
    out.write(f"#导出时间：[{alipay_time(exported_at)}]\n")
    return out.getvalue()


def summary_csv(seller_id: str, day: date, trades: list[Trade]) -> str:
    total = yuan(sum(t.amount_fen for t in trades))
    return (f"#支付宝业务汇总查询\n#账号：[{seller_id}0156]\n#起始日期：[{day:%Y年%m月%d日} 00:00:00]\n"
            f"门店编号,门店名称,交易订单总笔数,退款订单总笔数,订单金额（元）,商家实收（元）\n"
            f"合计,,{len(trades)},0,{total},{total}\n#结束\n")


def bill_zip(seller_id: str, day: date, trades: list[Trade], exported_at: float) -> bytes:
    stem = f"{seller_id}0156_{day:%Y%m%d}"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, text in ((f"{stem}_业务明细.csv", detail_csv(seller_id, day, trades, exported_at)),
                           (f"{stem}_业务明细(汇总).csv", summary_csv(seller_id, day, trades))):
            info = _GbkName(name, date_time=(day.year, day.month, day.day, 9, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, text.encode("gbk"))
    return buffer.getvalue()
