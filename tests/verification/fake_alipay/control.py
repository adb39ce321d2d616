"""A JSON control API under ``/_control/`` so another process (the demo, a drill) can drive the
simulator: register apps, create users and balances, sign and revoke agreements, move the clock,
arm faults, deliver due notifications, read trades and deliveries. No authentication: loopback only."""

from __future__ import annotations

import json
import re
from typing import Any

from tests.verification.fake_alipay.api import Request, Response, json_response
from tests.verification.fake_alipay.core import AlipaySimulatorCore

_ID = r"(?P<id>[^/]+)"
ROUTES = [
    ("POST", r"^/_control/apps$", "register_app"),
    ("POST", r"^/_control/users$", "create_user"),
    ("POST", rf"^/_control/users/{_ID}/balance$", "set_balance"),
    ("GET", rf"^/_control/users/{_ID}$", "user"),
    ("POST", r"^/_control/agreements$", "sign_agreement"),
    ("POST", rf"^/_control/agreements/{_ID}/revoke$", "revoke_agreement"),
    ("GET", rf"^/_control/agreements/{_ID}$", "agreement"),
    ("GET", r"^/_control/clock$", "clock"),
    ("POST", r"^/_control/clock/advance$", "advance"),
    ("POST", r"^/_control/faults$", "arm_fault"),
    ("POST", r"^/_control/faults/clear$", "clear_faults"),
    ("POST", r"^/_control/deliver_due$", "deliver_due"),
    ("GET", r"^/_control/trades$", "trades"),
    ("POST", rf"^/_control/trades/{_ID}/settle$", "settle_trade"),
    ("POST", rf"^/_control/trades/{_ID}/finish$", "finish_trade"),
    ("GET", r"^/_control/deliveries$", "deliveries"),
    ("GET", r"^/_control/notifications$", "notifications"),
]
COMPILED = [(verb, re.compile(rx), name) for verb, rx, name in ROUTES]


class ControlApi:
    def __init__(self, sim: AlipaySimulatorCore) -> None:
        self.sim = sim

    def handle(self, req: Request) -> Response:
        for verb, rx, name in COMPILED:
            match = rx.match(req.path)
            if verb == req.method and match:
                try:
                    body = json.loads(req.body or b"{}")
                    if not isinstance(body, dict):
                        raise ValueError("control API bodies are JSON objects")
                    return json_response(200, getattr(self, name)(match.groupdict(), body))
                except (KeyError, TypeError, ValueError) as exc:
                    return json_response(400, {"error": f"bad control request: {exc!r}"})
        return json_response(404, {"error": f"no control route {req.method} {req.path}"})

    def register_app(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        app = self.sim.register_app(body["app_id"], body["public_key_pem"], body.get("notify_url", ""))
        return {"app_id": app.app_id, "seller_id": app.seller_id, "notify_url": app.notify_url,
                "alipay_public_key_pem": self.sim.alipay_public_pem}

    def create_user(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        return {"user_id": self.sim.create_user(int(body.get("balance_fen", 0)), body.get("user_id"))}

    def set_balance(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        self.sim.set_balance(args["id"], int(body["balance_fen"]))
        return self.user(args, body)

    def user(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        return {"user_id": args["id"], "balance_fen": self.sim.balance(args["id"])}

    def sign_agreement(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        agreement_no = self.sim.sign_agreement(body["app_id"], body["user_id"], body["external_agreement_no"],
                                               body.get("notify_url"))
        return self.sim.agreement(agreement_no)

    def revoke_agreement(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        self.sim.revoke_agreement(args["id"])
        return self.sim.agreement(args["id"])

    def agreement(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        return self.sim.agreement(args["id"])

    def clock(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        return {"now": self.sim.now()}

    def advance(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        return {"now": self.sim.advance(float(body["seconds"]))}

    def arm_fault(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        kind, faults, count = body["kind"], self.sim.faults, int(body.get("count", 1))
        if kind == "duplicate_notifications":
            faults.duplicate_notifications(count)
        elif kind == "drop_notifications":
            faults.drop_notifications(count)
        elif kind == "delay_notifications":
            faults.delay_notifications(float(body["seconds"]), count)
        else:
            faults.arm(kind, body.get("method", "*"), count=count, apply=bool(body.get("apply", False)),
                       hold_seconds=float(body.get("hold_seconds", 2.0)))
        return {"armed": kind}

    def clear_faults(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        self.sim.faults.clear()
        return {"cleared": True}

    def deliver_due(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        return {"deliveries": [d.as_dict() for d in self.sim.deliver_due()]}

    def trades(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        return {"trades": self.sim.trade_list()}

    def settle_trade(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        return self.sim.settle_trade(body["app_id"], args["id"], success=bool(body.get("success", True)))

    def finish_trade(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        return self.sim.finish_trade(body["app_id"], args["id"])

    def deliveries(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        return {"deliveries": [d.as_dict() for d in self.sim.delivery_log()]}

    def notifications(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        return {"notifications": self.sim.notification_list()}
