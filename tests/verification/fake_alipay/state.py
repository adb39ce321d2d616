"""The simulator's objects: merchant apps, Alipay users, withholding agreements, trades; ids shaped
like Alipay's and times written as Alipay writes them (Asia/Shanghai, ``YYYY-MM-DD HH:MM:SS``)."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone

# China has had no daylight saving since 1991: a fixed +08:00 is Asia/Shanghai.
SHANGHAI = timezone(timedelta(hours=8), "Asia/Shanghai")
PERSONAL_PRODUCT_CODE = "CYCLE_PAY_AUTH_P"
FAR_FUTURE = "2115-02-01 00:00:00"  # what Alipay shows as the invalid_time of a live agreement

WAIT_BUYER_PAY, TRADE_CLOSED, TRADE_SUCCESS, TRADE_FINISHED = (
    "WAIT_BUYER_PAY", "TRADE_CLOSED", "TRADE_SUCCESS", "TRADE_FINISHED")
NORMAL, UNSIGN = "NORMAL", "UNSIGN"

_YUAN = re.compile(r"(0|[1-9][0-9]{0,8})(\.[0-9]{1,2})?")


def shanghai(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC).astimezone(SHANGHAI)


def alipay_time(ts: float) -> str:
    return shanghai(ts).strftime("%Y-%m-%d %H:%M:%S")


def parse_yuan(text: object) -> int | None:
    """Fen for a valid Alipay amount (``"12.34"``, 0.01 to 100000000), else None. The simulator's own
    parser, independent of the product's ``money`` module."""
    if not isinstance(text, str) or not _YUAN.fullmatch(text):
        return None
    whole, _, decimals = text.partition(".")
    fen = int(whole) * 100 + int((decimals + "00")[:2])
    return fen if 1 <= fen <= 100_000_000 * 100 else None


def yuan(fen: int) -> str:
    return f"{fen // 100}.{fen % 100:02d}"


@dataclass
class App:
    app_id: str
    public_key_pem: str
    notify_url: str
    seller_id: str  # the merchant's 2088… partner id


@dataclass
class User:
    user_id: str  # 2088 + 12 digits
    balance_fen: int
    logon_id: str


@dataclass
class Agreement:
    agreement_no: str
    external_agreement_no: str
    app_id: str
    user_id: str
    status: str
    sign_time: str
    valid_time: str
    invalid_time: str
    notify_url: str

    def render(self) -> dict[str, str]:
        return {"agreement_no": self.agreement_no, "external_agreement_no": self.external_agreement_no,
                "status": self.status, "sign_time": self.sign_time, "valid_time": self.valid_time,
                "invalid_time": self.invalid_time, "alipay_user_id": self.user_id,
                "personal_product_code": PERSONAL_PRODUCT_CODE, "sign_scene": "INDUSTRY|DEFAULT_SCENE"}


@dataclass
class Trade:
    trade_no: str
    out_trade_no: str
    app_id: str
    agreement_no: str
    user_id: str
    amount_fen: int
    subject: str
    status: str
    created_at: float
    notify_url: str
    paid_at: float | None = None
    closed_at: float | None = None
    history: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {"trade_no": self.trade_no, "out_trade_no": self.out_trade_no, "app_id": self.app_id,
                "agreement_no": self.agreement_no, "buyer_user_id": self.user_id, "amount_fen": self.amount_fen,
                "total_amount": yuan(self.amount_fen), "subject": self.subject, "trade_status": self.status,
                "gmt_create": alipay_time(self.created_at),
                "gmt_payment": alipay_time(self.paid_at) if self.paid_at is not None else None,
                "gmt_close": alipay_time(self.closed_at) if self.closed_at is not None else None,
                "notify_url": self.notify_url, "history": list(self.history)}


class Ids:
    """Alipay-shaped identifiers, unique within one simulator."""

    def __init__(self) -> None:
        self._seq = itertools.count(1)

    def _n(self) -> int:
        return next(self._seq)

    def trade_no(self, ts: float) -> str:  # 28 digits: date, 22001, sequence
        return f"{shanghai(ts):%Y%m%d}22001{self._n():015d}"

    def agreement_no(self, ts: float) -> str:  # 20 digits
        return f"{shanghai(ts):%Y%m%d}{self._n():012d}"

    def user_id(self) -> str:  # 16 digits starting 2088
        return f"2088{self._n():012d}"

    def notify_id(self, ts: float) -> str:
        return f"{shanghai(ts):%Y%m%d%H%M%S}{self._n():018d}"
