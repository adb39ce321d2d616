"""``AlipayGateway``: the only module of the product that talks HTTP to Alipay (issue 20).

Django-free. Requests are signed and answers verified by python-alipay-sdk (``alipay.AliPay``, RSA2):
the SDK sends ``GET gateway?<signed query>`` and checks Alipay's signature over the exact JSON text of
``<method_with_underscores>_response``. What the product may rely on:

* every answer Alipay signed comes back as a ``GatewayAnswer`` (10000 success, 10003 in progress,
  20000 system error, 40004 business failure: the adapter decides what a ``sub_code`` means);
* a signed 40002 (our request was malformed or not authorised) raises ``ProviderRequestError``;
* anything else (timeout, connection error, HTTP error status, an answer that is unreadable, unsigned
  or badly signed) raises ``ProviderIndeterminate``: the call may or may not have taken effect, so a
  ``trade_pay`` must be followed by ``trade_query`` before any new attempt (seed 003).
"""

from __future__ import annotations

import binascii
import csv
import http.client
import io
import json
import urllib.error
import urllib.request
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any
from zoneinfo import ZoneInfo

from alipay import AliPay
from alipay.exceptions import AliPayException, AliPayValidationError
from alipay.utils import AliPayConfig

from subscriptions.providers.alipay.money import fen_to_yuan, yuan_to_fen
from subscriptions.providers.base import ProviderIndeterminate, ProviderNotFound, ProviderRequestError

SHANGHAI = ZoneInfo("Asia/Shanghai")
SUCCESS = "10000"
IN_PROGRESS = "10003"
SYSTEM_ERROR = "20000"
INVALID_ARGUMENTS = "40002"
BUSINESS_FAILED = "40004"

# The trade bill's column names (GBK CSV in a zip), as Alipay writes them.
_BILL_COLUMNS = {
    "trade_no": "支付宝交易号", "out_trade_no": "商户订单号", "business_type": "业务类型", "subject": "商品名称",
    "created_at": "创建时间", "finished_at": "完成时间", "amount": "订单金额（元）",
}


@dataclass(frozen=True)
class GatewayAnswer:
    """An answer Alipay signed. ``body`` is the verified ``<method>_response`` object; ``raw_text`` the
    whole HTTP body as received (the receipt)."""

    method: str
    code: str
    msg: str
    sub_code: str
    sub_msg: str
    body: dict[str, Any] = field(compare=False)
    raw_text: str = field(compare=False, repr=False)

    @property
    def ok(self) -> bool:
        return self.code == SUCCESS


@dataclass(frozen=True)
class BillRow:
    """One detail row of Alipay's daily trade bill. ``status`` is derived (the bill has no status
    column; it lists only finished money movements): ``TRADE_SUCCESS`` for a 交易 row, ``REFUND`` for
    a 退款 row (whose amount is negative), else the business type as written."""

    trade_no: str
    out_trade_no: str
    business_type: str
    subject: str
    created_at: datetime | None
    finished_at: datetime | None
    amount_fen: int
    status: str


@dataclass(frozen=True)
class _Signed:
    body: dict[str, Any]
    raw_text: str


class _AliPayAt(AliPay):
    """``alipay.AliPay`` pointed at ``gateway_url``.

    The SDK hard-codes its gateway in ``__init__`` (``self._gateway`` is openapi.alipay.com, or the
    sandbox with ``debug=True``) and takes no URL parameter, so the simulator and any other endpoint
    are set here after the SDK's own initialisation."""

    def __init__(self, *, gateway_url: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._gateway = gateway_url

    def verified_sync_response(self, data: dict[str, Any], response_type: str) -> _Signed:
        # The SDK's own fetch and check, keeping the raw text (the SDK returns only the parsed object).
        url = self._gateway + "?" + self.sign_data(data)
        raw_text = urllib.request.urlopen(url, timeout=self._config.timeout).read().decode("utf-8")
        return _Signed(self._verify_and_return_sync_response(raw_text, response_type), raw_text)


class AlipayGateway:
    def __init__(self, app_id: str, app_private_key_pem: str, alipay_public_key_pem: str, gateway_url: str,
                 notify_url: str, timeout_seconds: float) -> None:
        self.app_id = app_id
        self.gateway_url = gateway_url
        self.notify_url = notify_url
        self.timeout_seconds = timeout_seconds
        self._sdk = _AliPayAt(gateway_url=gateway_url, appid=app_id, app_notify_url=notify_url or None,
                              app_private_key_string=app_private_key_pem,
                              alipay_public_key_string=alipay_public_key_pem, sign_type="RSA2",
                              config=AliPayConfig(timeout=timeout_seconds))

    # ---- the calls
    def trade_pay(self, out_trade_no: str, agreement_no: str, amount_fen: int, subject: str) -> GatewayAnswer:
        """Deduct ``amount_fen`` under the user's agreement (product GENERAL_WITHHOLDING)."""
        biz = {"out_trade_no": out_trade_no, "total_amount": fen_to_yuan(amount_fen), "subject": subject,
               "product_code": "GENERAL_WITHHOLDING", "agreement_params": {"agreement_no": agreement_no}}
        # server_api, not api_alipay_trade_pay: the SDK's helper is for bar-code payments (scene/auth_code).
        return self._call("alipay.trade.pay", biz, notify_url=self.notify_url)

    def trade_query(self, out_trade_no: str) -> GatewayAnswer:
        return self._call("alipay.trade.query", {"out_trade_no": out_trade_no})

    def agreement_query(self, agreement_no: str) -> GatewayAnswer:
        return self._call("alipay.user.agreement.query", {"agreement_no": agreement_no})

    def agreement_unsign(self, agreement_no: str) -> GatewayAnswer:
        return self._call("alipay.user.agreement.unsign", {"agreement_no": agreement_no})

    def bill_download_url(self, bill_date: date) -> GatewayAnswer:
        return self._call("alipay.data.dataservice.bill.downloadurl.query",
                          {"bill_type": "trade", "bill_date": bill_date.strftime("%Y-%m-%d")})

    def bill_rows(self, bill_date: date) -> list[BillRow]:
        """The day's trade bill, downloaded and parsed. A 40004 (no bill for that day) raises
        ``ProviderNotFound``; any other unsuccessful answer ``ProviderIndeterminate``."""
        answer = self.bill_download_url(bill_date)
        if answer.code == BUSINESS_FAILED:
            raise ProviderNotFound(f"alipay bill {bill_date}: {answer.sub_code} {answer.sub_msg}")
        url = answer.body.get("bill_download_url")
        if not answer.ok or not isinstance(url, str) or not url:
            raise ProviderIndeterminate(f"alipay bill {bill_date}: no download URL (code {answer.code} "
                                        f"{answer.sub_code})")
        try:
            content = urllib.request.urlopen(url, timeout=self.timeout_seconds).read()
        except Exception as exc:  # every transport failure means the same: try again later
            raise ProviderIndeterminate(f"alipay bill download: {_describe(exc)}") from exc
        try:
            return parse_bill_zip(content)
        except (zipfile.BadZipFile, UnicodeDecodeError, ValueError, KeyError, csv.Error) as exc:
            raise ProviderIndeterminate(f"alipay bill download: unreadable bill ({_describe(exc)})") from exc

    # ---- notifications
    def verify_notification(self, form: Mapping[str, str]) -> bool:
        """RSA2 check of an asynchronous notification as Alipay defines it: drop ``sign`` and
        ``sign_type``, drop empty values, sort by key, join ``k=v`` with ``&``, verify with Alipay's
        public key. Never raises: anything malformed is simply not verified."""
        try:
            if not isinstance(form, Mapping):
                return False
            sign, sign_type = form.get("sign"), form.get("sign_type")
            if not isinstance(sign, str) or not sign or sign_type != "RSA2":
                return False
            data: dict[str, str] = {}
            for key, value in form.items():
                if not isinstance(key, str) or not isinstance(value, str):
                    return False
                if key not in ("sign", "sign_type") and value != "":
                    data[key] = value
            # verify() pops sign_type from (and json-dumps dicts in) the dict it gets: it gets a copy
            # without sign_type, already checked above.
            return bool(self._sdk.verify(dict(data), sign))
        except Exception:  # bad base64, odd keys, crypto errors: not verified
            return False

    # ---- internals
    def _call(self, method: str, biz: dict[str, Any], **kwargs: Any) -> GatewayAnswer:
        try:
            signed = self._sdk.server_api(method, biz, **kwargs)
        except urllib.error.HTTPError as exc:
            raise ProviderIndeterminate(f"{method}: HTTP {exc.code} from the gateway") from exc
        except AliPayValidationError as exc:
            raise ProviderIndeterminate(f"{method}: the answer's signature does not verify") from exc
        except AliPayException as exc:
            raise ProviderIndeterminate(f"{method}: unsigned answer ({exc})") from exc
        except (TimeoutError, urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            raise ProviderIndeterminate(f"{method}: {_describe(exc)}") from exc
        except (json.JSONDecodeError, UnicodeDecodeError, binascii.Error) as exc:
            raise ProviderIndeterminate(f"{method}: unreadable answer ({_describe(exc)})") from exc
        except Exception as exc:  # the SDK trips over odd shapes (None.get, ...): unreadable
            raise ProviderIndeterminate(f"{method}: unreadable answer ({_describe(exc)})") from exc
        body = signed.body
        code = body.get("code") if isinstance(body, dict) else None
        if not isinstance(code, str) or not code:
            raise ProviderIndeterminate(f"{method}: signed answer without a code")
        answer = GatewayAnswer(method=method, code=code, msg=str(body.get("msg", "")),
                               sub_code=str(body.get("sub_code", "")), sub_msg=str(body.get("sub_msg", "")),
                               body=body, raw_text=signed.raw_text)
        if code == INVALID_ARGUMENTS:
            raise ProviderRequestError(f"{method}: {code} {answer.msg} {answer.sub_code} {answer.sub_msg}".strip())
        return answer


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError) or (isinstance(exc, urllib.error.URLError)
                                         and isinstance(exc.reason, TimeoutError)):
        return f"timeout ({type(exc).__name__}: {exc})"
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code}"
    return f"{type(exc).__name__}: {exc}"


def _member_name(info: zipfile.ZipInfo) -> str:
    """Alipay writes GBK file names without the zip UTF-8 flag; zipfile then decodes them as cp437."""
    if info.flag_bits & 0x800:
        return info.filename
    try:
        return info.filename.encode("cp437").decode("gbk")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return info.filename


def parse_bill_zip(content: bytes) -> list[BillRow]:
    """The detail CSV of a trade-bill zip (the member that is not the ``(汇总)`` summary)."""
    with zipfile.ZipFile(io.BytesIO(content)) as archive:
        members = [m for m in archive.infolist() if _member_name(m).lower().endswith(".csv")]
        details = [m for m in members if "汇总" not in _member_name(m)]
        if not details:
            raise ValueError("no detail CSV in the bill zip")
        return parse_bill_csv(archive.read(details[0]).decode("gbk"))


def parse_bill_csv(text: str) -> list[BillRow]:
    """Rows of a trade bill: ``#`` lines (title, account, dates, footer totals) are skipped, the first
    other line is the header, every following line a detail row. Alipay pads fields with tabs."""
    rows: list[BillRow] = []
    header: dict[str, int] | None = None
    for record in csv.reader(io.StringIO(text)):
        cells = [cell.strip() for cell in record]
        if not cells or not any(cells) or cells[0].startswith("#"):
            continue
        if header is None:
            header = {name: i for i, name in enumerate(cells)}
            missing = [name for name in _BILL_COLUMNS.values() if name not in header]
            if missing:
                raise ValueError(f"bill header lacks {missing}")
            continue
        value = {key: cells[header[name]] if header[name] < len(cells) else "" for key, name in _BILL_COLUMNS.items()}
        amount = value["amount"]
        fen = -yuan_to_fen(amount[1:]) if amount.startswith("-") else yuan_to_fen(amount)
        business_type = value["business_type"]
        status = {"交易": "TRADE_SUCCESS", "退款": "REFUND"}.get(business_type, business_type)
        rows.append(BillRow(trade_no=value["trade_no"], out_trade_no=value["out_trade_no"],
                            business_type=business_type, subject=value["subject"],
                            created_at=_bill_time(value["created_at"]), finished_at=_bill_time(value["finished_at"]),
                            amount_fen=fen, status=status))
    return rows


def _bill_time(text: str) -> datetime | None:
    if not text:
        return None
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S").replace(tzinfo=SHANGHAI)
