"""``AlipaySimulatorCore``: apps, users, agreements, trades, the clock and the notification outbox,
guarded by one lock. The gateway handlers (`api`) and the control API (`control`) act on it; the
``api_*`` methods return the inner object of ``<method>_response`` (the HTTP layer signs it)."""

from __future__ import annotations

import copy
import threading
import time
import uuid
from collections.abc import Callable
from datetime import date, datetime
from typing import Any

from tests.verification.fake_alipay.faults import AlipayFaults
from tests.verification.fake_alipay.notify import NotificationMixin
from tests.verification.fake_alipay.state import (
    FAR_FUTURE,
    NORMAL,
    PERSONAL_PRODUCT_CODE,
    TRADE_CLOSED,
    TRADE_FINISHED,
    TRADE_SUCCESS,
    UNSIGN,
    WAIT_BUYER_PAY,
    Agreement,
    App,
    Ids,
    Trade,
    User,
    alipay_time,
    parse_yuan,
    shanghai,
    yuan,
)

# Real Alipay's sub_code when the user's balance cannot cover a withholding (买家余额不足).
BALANCE_NOT_ENOUGH = "ACQ.BUYER_BALANCE_NOT_ENOUGH"
Answer = dict[str, Any]


def ok(**fields: Any) -> Answer:
    return {"code": "10000", "msg": "Success", **fields}


def failed(sub_code: str, sub_msg: str, *, code: str = "40004", msg: str = "Business Failed") -> Answer:
    return {"code": code, "msg": msg, "sub_code": sub_code, "sub_msg": sub_msg}


class AlipaySimulatorCore(NotificationMixin):
    def __init__(self, *, alipay_private_pem: str, alipay_public_pem: str, start_time: float | None = None,
                 notify_timeout: float = 5.0, logger: Callable[[str], None] | None = None) -> None:
        self.lock = threading.RLock()
        self.alipay_private_pem = alipay_private_pem
        self.alipay_public_pem = alipay_public_pem
        self.notify_timeout = notify_timeout
        self.logger = logger
        self._offset = 0.0 if start_time is None else start_time - time.time()
        self.faults = AlipayFaults()
        self.ids = Ids()
        self.apps: dict[str, App] = {}
        self.users: dict[str, User] = {}
        self.agreements: dict[str, Agreement] = {}
        self.trades: dict[tuple[str, str], Trade] = {}  # (app_id, out_trade_no)
        self.bill_tokens: dict[str, tuple[str, date]] = {}
        self.bill_base_url = ""  # set by the server; bill download URLs point here
        self._init_notifications()

    # ---- clock
    def now(self) -> float:
        """The simulator clock: real time plus whatever ``advance`` added."""
        return time.time() + self._offset

    def advance(self, seconds: float) -> float:
        with self.lock:
            self._offset += float(seconds)
            return self.now()

    def log(self, message: str) -> None:
        if self.logger is not None:
            self.logger(message)

    # ---- control: apps, users, agreements
    def register_app(self, app_id: str, public_key_pem: str, notify_url: str = "") -> App:
        with self.lock:
            app = App(app_id, public_key_pem, notify_url, self.ids.user_id())
            self.apps[app_id] = app
            return app

    def create_user(self, balance_fen: int = 0, user_id: str | None = None) -> str:
        with self.lock:
            uid = user_id or self.ids.user_id()
            self.users[uid] = User(uid, int(balance_fen), f"{uid[-4:]}***@example.com")
            return uid

    def set_balance(self, user_id: str, balance_fen: int) -> None:
        with self.lock:
            self.users[user_id].balance_fen = int(balance_fen)

    def balance(self, user_id: str) -> int:
        with self.lock:
            return self.users[user_id].balance_fen

    def sign_agreement(self, app_id: str, user_id: str, external_agreement_no: str,
                       notify_url: str | None = None) -> str:
        """The user signs a withholding agreement with the merchant (sends ``dut_user_sign``)."""
        with self.lock:
            app, now = self.apps[app_id], self.now()
            if user_id not in self.users:
                raise KeyError(f"no such user {user_id}")
            agreement = Agreement(self.ids.agreement_no(now), external_agreement_no, app_id, user_id, NORMAL,
                                  alipay_time(now), alipay_time(now), FAR_FUTURE, notify_url or app.notify_url)
            self.agreements[agreement.agreement_no] = agreement
            self._agreement_notice(agreement, "dut_user_sign")
            return agreement.agreement_no

    def revoke_agreement(self, agreement_no: str) -> None:
        """The user cancels the agreement in the Alipay app (sends ``dut_user_unsign``)."""
        with self.lock:
            self._unsign(self.agreements[agreement_no])

    def agreement(self, agreement_no: str) -> dict[str, str]:
        with self.lock:
            return self.agreements[agreement_no].render()

    def _unsign(self, agreement: Agreement) -> None:
        if agreement.status == UNSIGN:
            return
        agreement.status, agreement.invalid_time = UNSIGN, alipay_time(self.now())
        self._agreement_notice(agreement, "dut_user_unsign")

    def _agreement_notice(self, agreement: Agreement, notify_type: str) -> None:
        if not agreement.notify_url:
            return
        params = {k: v for k, v in agreement.render().items() if k != "sign_scene"}
        params["app_id"] = agreement.app_id
        if notify_type == "dut_user_unsign":
            params["unsign_time"] = agreement.invalid_time
        self._notify(notify_type, agreement.notify_url, params)

    # ---- control: trades
    def trade_list(self, app_id: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            return [t.as_dict() for t in self.trades.values() if app_id is None or t.app_id == app_id]

    def trade(self, out_trade_no: str, app_id: str | None = None) -> dict[str, Any] | None:
        with self.lock:
            found = [t for (a, o), t in self.trades.items() if o == out_trade_no and app_id in (None, a)]
            return found[0].as_dict() if found else None

    def settle_trade(self, app_id: str, out_trade_no: str, *, success: bool) -> dict[str, Any]:
        """Finish a trade left WAIT_BUYER_PAY by the ``in_progress`` fault: charge it or close it."""
        with self.lock:
            trade = self.trades[(app_id, out_trade_no)]
            if trade.status != WAIT_BUYER_PAY:
                raise ValueError(f"trade {out_trade_no} is {trade.status}")
            user = self.users[trade.user_id]
            if success and user.balance_fen >= trade.amount_fen:
                user.balance_fen -= trade.amount_fen
                self._set_status(trade, TRADE_SUCCESS)
            else:
                self._set_status(trade, TRADE_CLOSED)
            return trade.as_dict()

    def finish_trade(self, app_id: str, out_trade_no: str) -> dict[str, Any]:
        """TRADE_SUCCESS → TRADE_FINISHED (the refund window is over); Alipay notifies it too."""
        with self.lock:
            trade = self.trades[(app_id, out_trade_no)]
            if trade.status != TRADE_SUCCESS:
                raise ValueError(f"trade {out_trade_no} is {trade.status}")
            self._set_status(trade, TRADE_FINISHED)
            return trade.as_dict()

    def _set_status(self, trade: Trade, status: str) -> None:
        now = self.now()
        trade.status = status
        trade.history.append(f"{alipay_time(now)} {status}")
        if status == TRADE_SUCCESS:
            trade.paid_at = now
        elif status == TRADE_CLOSED:
            trade.closed_at = now
        if status != WAIT_BUYER_PAY and trade.notify_url:
            self._notify("trade_status_sync", trade.notify_url, self._trade_params(trade))

    def _trade_params(self, trade: Trade) -> dict[str, str]:
        params = {"app_id": trade.app_id, "auth_app_id": trade.app_id, "trade_no": trade.trade_no,
                  "out_trade_no": trade.out_trade_no, "trade_status": trade.status,
                  "total_amount": yuan(trade.amount_fen), "buyer_id": trade.user_id,
                  "seller_id": self.apps[trade.app_id].seller_id, "gmt_create": alipay_time(trade.created_at),
                  "subject": trade.subject}
        if trade.paid_at is not None:
            params |= {"gmt_payment": alipay_time(trade.paid_at), "receipt_amount": yuan(trade.amount_fen),
                       "buyer_pay_amount": yuan(trade.amount_fen), "invoice_amount": yuan(trade.amount_fen)}
        if trade.closed_at is not None:
            params["gmt_close"] = alipay_time(trade.closed_at)
        return params

    # ---- the gateway's methods
    def api_trade_pay(self, app: App, biz: dict[str, Any], params: dict[str, str], *,
                      in_progress: bool = False) -> Answer:
        out_trade_no, subject = biz.get("out_trade_no"), biz.get("subject")
        agreement_no = (biz.get("agreement_params") or {}).get("agreement_no") \
            if isinstance(biz.get("agreement_params"), dict) else None
        if not isinstance(out_trade_no, str) or not out_trade_no or len(out_trade_no) > 64:
            return failed("isv.missing-parameter", "缺少必选参数 out_trade_no", code="40002",
                          msg="Invalid Arguments")
        if not isinstance(subject, str) or not subject:
            return failed("isv.missing-parameter", "缺少必选参数 subject", code="40002", msg="Invalid Arguments")
        fen = parse_yuan(biz.get("total_amount"))
        if fen is None:
            return failed("ACQ.INVALID_PARAMETER", "参数无效 total_amount")
        if biz.get("product_code") not in ("GENERAL_WITHHOLDING", "CYCLE_PAY_AUTH"):
            return failed("ACQ.INVALID_PARAMETER", "参数无效 product_code")
        with self.lock:
            existing = self.trades.get((app.app_id, out_trade_no))
            if existing is not None:
                if existing.status in (TRADE_SUCCESS, TRADE_FINISHED):
                    return failed("ACQ.TRADE_HAS_SUCCESS", "交易已被支付")
                if existing.status == TRADE_CLOSED:
                    return failed("ACQ.TRADE_HAS_CLOSE", "交易已经关闭")
                return failed("ACQ.SYSTEM_ERROR", "交易处理中，请稍后查询", code="20000",
                              msg="Service Currently Unavailable")
            agreement = self.agreements.get(agreement_no) if isinstance(agreement_no, str) else None
            if agreement is None or agreement.app_id != app.app_id:
                return failed("ACQ.AGREEMENT_NOT_EXIST", "协议不存在")
            if agreement.status != NORMAL:
                return failed("ACQ.AGREEMENT_INVALID", "用户协议已失效")
            now = self.now()
            trade = Trade(self.ids.trade_no(now), out_trade_no, app.app_id, agreement.agreement_no,
                          agreement.user_id, fen, subject, WAIT_BUYER_PAY, now,
                          params.get("notify_url") or app.notify_url, history=[f"{alipay_time(now)} created"])
            self.trades[(app.app_id, out_trade_no)] = trade
            if in_progress:
                return {"code": "10003", "msg": "order success pay inprocess", "trade_no": trade.trade_no,
                        "out_trade_no": out_trade_no, "total_amount": yuan(fen), "buyer_user_id": trade.user_id}
            user = self.users[agreement.user_id]
            if user.balance_fen < fen:
                self._set_status(trade, TRADE_CLOSED)
                return failed(BALANCE_NOT_ENOUGH, "买家余额不足")
            user.balance_fen -= fen
            self._set_status(trade, TRADE_SUCCESS)
            return ok(trade_no=trade.trade_no, out_trade_no=out_trade_no, buyer_logon_id=user.logon_id,
                      total_amount=yuan(fen), receipt_amount=yuan(fen), buyer_pay_amount=yuan(fen),
                      gmt_payment=alipay_time(now), buyer_user_id=user.user_id)

    def api_trade_query(self, app: App, biz: dict[str, Any], params: dict[str, str]) -> Answer:
        out_trade_no, trade_no = biz.get("out_trade_no"), biz.get("trade_no")
        if not out_trade_no and not trade_no:
            return failed("isv.missing-parameter", "out_trade_no 和 trade_no 不能同时为空", code="40002",
                          msg="Invalid Arguments")
        with self.lock:
            trade = next((t for t in self.trades.values() if t.app_id == app.app_id
                          and (t.out_trade_no == out_trade_no or (trade_no and t.trade_no == trade_no))), None)
            if trade is None:
                return failed("ACQ.TRADE_NOT_EXIST", "交易不存在")
            answer = ok(trade_no=trade.trade_no, out_trade_no=trade.out_trade_no,
                        buyer_logon_id=self.users[trade.user_id].logon_id, trade_status=trade.status,
                        total_amount=yuan(trade.amount_fen), buyer_user_id=trade.user_id)
            if trade.paid_at is not None:
                answer |= {"receipt_amount": yuan(trade.amount_fen), "buyer_pay_amount": yuan(trade.amount_fen),
                           "send_pay_date": alipay_time(trade.paid_at)}
            return answer

    def api_agreement_query(self, app: App, biz: dict[str, Any], params: dict[str, str]) -> Answer:
        with self.lock:
            agreement = self._find_agreement(app, biz)
            if agreement is None:
                return failed("USER_AGREEMENT_NOT_EXIST", "用户协议不存在")
            return ok(**agreement.render())

    def api_agreement_unsign(self, app: App, biz: dict[str, Any], params: dict[str, str]) -> Answer:
        with self.lock:
            agreement = self._find_agreement(app, biz)
            if agreement is None:
                return failed("USER_AGREEMENT_NOT_EXIST", "用户协议不存在")
            self._unsign(agreement)  # unsigning an unsigned agreement is a quiet success here
            return ok()

    def _find_agreement(self, app: App, biz: dict[str, Any]) -> Agreement | None:
        no, external = biz.get("agreement_no"), biz.get("external_agreement_no")
        for agreement in self.agreements.values():
            if agreement.app_id == app.app_id and (
                    (no and agreement.agreement_no == no) or (not no and external
                                                              and agreement.external_agreement_no == external)):
                return agreement
        return None

    def api_bill_download_url(self, app: App, biz: dict[str, Any], params: dict[str, str]) -> Answer:
        if biz.get("bill_type") != "trade":
            return failed("isp.bill_type_not_support", "账单类型不支持（模拟器只有 trade）")
        try:
            day = datetime.strptime(str(biz.get("bill_date")), "%Y-%m-%d").date()
        except ValueError:
            return failed("isv.invalid-parameter", "bill_date 格式错误", code="40002", msg="Invalid Arguments")
        if day >= shanghai(self.now()).date():
            return failed("isp.bill_not_exist", "账单不存在")
        token = uuid.uuid4().hex
        with self.lock:
            self.bill_tokens[token] = (app.app_id, day)
        return ok(bill_download_url=f"{self.bill_base_url}/bills/{token}")

    def bill_trades(self, app_id: str, day: date) -> list[Trade]:
        """Successful trades whose payment finished on ``day`` (Asia/Shanghai)."""
        with self.lock:
            return [copy.copy(t) for t in self.trades.values() if t.app_id == app_id and t.paid_at is not None
                    and t.status in (TRADE_SUCCESS, TRADE_FINISHED) and shanghai(t.paid_at).date() == day]

    def seller_id(self, app_id: str) -> str:
        return self.apps[app_id].seller_id


__all__ = ["BALANCE_NOT_ENOUGH", "PERSONAL_PRODUCT_CODE", "AlipaySimulatorCore", "failed", "ok"]
