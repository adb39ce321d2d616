"""The HTTP surface: ``/gateway.do`` (Alipay's OpenAPI gateway), ``/bills/<token>`` (bill downloads)
and ``/_control/`` (delegated to `control`). Pure request → response; `server` does the sockets."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from tests.verification.fake_alipay.bill import bill_zip
from tests.verification.fake_alipay.core import AlipaySimulatorCore, failed
from tests.verification.fake_alipay.keys import sign_rsa2, signing_string, verify_rsa2
from tests.verification.fake_alipay.state import App


@dataclass
class Request:
    method: str
    path: str
    query: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Response:
    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    hang: float | None = None  # hold the connection this long, then close it without answering


def json_response(status: int, payload: Any) -> Response:
    return Response(status, json.dumps(payload, ensure_ascii=False, indent=1).encode("utf-8"),
                    {"Content-Type": "application/json; charset=utf-8"})


Handler = Callable[[App, dict[str, Any], dict[str, str]], dict[str, Any]]


class AlipayApi:
    def __init__(self, sim: AlipaySimulatorCore, control: Any | None) -> None:
        self.sim = sim
        self.control = control
        self.methods: dict[str, Handler] = {
            "alipay.trade.pay": sim.api_trade_pay,
            "alipay.trade.query": sim.api_trade_query,
            "alipay.user.agreement.query": sim.api_agreement_query,
            "alipay.user.agreement.unsign": sim.api_agreement_unsign,
            "alipay.data.dataservice.bill.downloadurl.query": sim.api_bill_download_url,
        }

    def handle(self, req: Request) -> Response:
        if req.path == "/gateway.do" and req.method in ("GET", "POST"):
            return self.gateway(req)
        if req.path.startswith("/bills/") and req.method == "GET":
            return self.bill(req.path.removeprefix("/bills/"))
        if req.path.startswith("/_control/") and self.control is not None:
            return self.control.handle(req)
        return json_response(404, {"error": f"no route {req.method} {req.path}"})

    # ---- /gateway.do
    def gateway(self, req: Request) -> Response:
        params = dict(parse_qsl(req.query, keep_blank_values=True))
        if req.method == "POST" and "x-www-form-urlencoded" in req.headers.get("content-type", ""):
            params |= dict(parse_qsl(req.body.decode("utf-8", "replace"), keep_blank_values=True))
        app_id, method = params.get("app_id", ""), params.get("method", "")
        app = self.sim.apps.get(app_id)
        if app is None:
            sub = ("isv.missing-app-id", "缺少AppID参数") if not app_id else ("isv.invalid-app-id", "无效的AppID参数")
            return self._unsigned_error(*sub)
        if not method:
            return self._unsigned_error("isv.missing-method", "缺少方法名参数")
        response_type = method.replace(".", "_") + "_response"
        if params.get("sign_type") != "RSA2":
            return self._signed(response_type, failed("isv.invalid-signature-type", "无效的签名类型",
                                                      code="40002", msg="Invalid Arguments"))
        if not params.get("sign"):
            return self._signed(response_type, failed("isv.missing-signature", "缺少签名参数",
                                                      code="40002", msg="Invalid Arguments"))
        if not verify_rsa2(app.public_key_pem, signing_string(params, exclude=("sign",)), params["sign"]):
            return self._signed(response_type, failed(
                "isv.invalid-signature", "验签出错，建议检查签名字符串或签名私钥与应用公钥是否匹配",
                code="40002", msg="Invalid Arguments"))
        handler = self.methods.get(method)
        if handler is None:
            return self._signed(response_type, failed("isv.invalid-method", "不存在的方法名", code="40002",
                                                      msg="Invalid Arguments"))
        try:
            biz = json.loads(params.get("biz_content") or "{}")
        except ValueError:
            biz = None
        if not isinstance(biz, dict):
            return self._signed(response_type, failed("isv.invalid-parameter", "biz_content 不是 JSON 对象",
                                                      code="40002", msg="Invalid Arguments"))
        return self._dispatch(method, response_type, handler, app, biz, params)

    def _dispatch(self, method: str, response_type: str, handler: Handler, app: App, biz: dict[str, Any],
                  params: dict[str, str]) -> Response:
        fault = self.sim.faults.take(method)
        if fault is None:
            return self._signed(response_type, handler(app, biz, params))
        self.sim.log(f"fault {fault.kind} (apply={fault.apply}) on {method}")
        if fault.kind == "in_progress" and method == "alipay.trade.pay":
            return self._signed(response_type, self.sim.api_trade_pay(app, biz, params, in_progress=True))
        if fault.kind == "tamper":
            return self._signed(response_type, handler(app, biz, params), tamper=True)
        if fault.apply:
            handler(app, biz, params)
        if fault.kind == "timeout":
            return Response(0, hang=fault.hold_seconds)
        if fault.kind == "http_502":
            return Response(502, b"<html><body><h1>502 Bad Gateway</h1></body></html>",
                            {"Content-Type": "text/html"})
        return self._signed(response_type, failed("ACQ.SYSTEM_ERROR", "系统错误", code="20000",
                                                  msg="Service Currently Unavailable"))

    def _signed(self, response_type: str, answer: dict[str, Any], *, tamper: bool = False) -> Response:
        """``{"<type>":<inner>,"sign":"…"}``, the signature over the exact text of <inner>."""
        inner = json.dumps(answer, ensure_ascii=False, separators=(",", ":"))
        sign = sign_rsa2(self.sim.alipay_private_pem, inner)
        if tamper:  # altered after signing, as a man in the middle would
            inner = inner.replace('"msg":"', '"msg":"X', 1)
        text = f'{{"{response_type}":{inner},"sign":"{sign}"}}'
        return Response(200, text.encode("utf-8"), {"Content-Type": "text/html;charset=utf-8"})

    @staticmethod
    def _unsigned_error(sub_code: str, sub_msg: str) -> Response:
        """Gateway-level refusals before an app is known: ``error_response``, no signature."""
        return json_response(200, {"error_response": failed(sub_code, sub_msg, code="40002",
                                                            msg="Invalid Arguments")})

    # ---- /bills/<token>
    def bill(self, token: str) -> Response:
        with self.sim.lock:
            found = self.sim.bill_tokens.get(token)
        if found is None:
            return Response(404, b"not found", {"Content-Type": "text/plain"})
        app_id, day = found
        content = bill_zip(self.sim.seller_id(app_id), day, self.sim.bill_trades(app_id, day), self.sim.now())
        return Response(200, content, {"Content-Type": "application/zip",
                                       "Content-Disposition": f'attachment; filename="{day:%Y%m%d}.csv.zip"'})
