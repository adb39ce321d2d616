"""A small JSON control API under ``/_sim/`` so another process (the demo, a drill) can drive the
simulator: create customers and subscriptions, save a customer's new card, make the provider
attempt a charge, let the customer pay, void, cancel, pause, resume or re-price a subscription,
end its trial or its period, deliver webhooks, arm faults, set the network realism (latency, rate
limit: ``POST /_sim/realism``) and read the ledger. No
authentication: loopback only."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from tests.verification.fake_stripe.api import Request, Response, json_response
from tests.verification.fake_stripe.core import SimulatorCore
from tests.verification.fake_stripe.errors import SimError
from tests.verification.fake_stripe.realism import NetworkProfile

_ID = r"(?P<id>[^/]+)"
ROUTES = [
    ("POST", r"^/_sim/customers$", "create_customer"),
    ("POST", rf"^/_sim/customers/{_ID}/card$", "set_card"),
    ("POST", rf"^/_sim/customers/{_ID}/payment_method$", "update_payment_method"),
    ("POST", r"^/_sim/subscriptions$", "create_subscription"),
    ("POST", rf"^/_sim/subscriptions/{_ID}/renewal$", "renewal"),
    ("POST", rf"^/_sim/subscriptions/{_ID}/cancel$", "cancel_subscription"),
    ("POST", rf"^/_sim/subscriptions/{_ID}/pause$", "pause_subscription"),
    ("POST", rf"^/_sim/subscriptions/{_ID}/resume$", "resume_subscription"),
    ("POST", rf"^/_sim/subscriptions/{_ID}/price$", "change_price"),
    ("POST", rf"^/_sim/subscriptions/{_ID}/end_trial$", "end_trial"),
    ("POST", rf"^/_sim/subscriptions/{_ID}/end_period$", "end_period"),
    ("GET", rf"^/_sim/subscriptions/{_ID}$", "subscription"),
    ("POST", rf"^/_sim/invoices/{_ID}/(?P<action>attempt|customer_pays|void|mark_uncollectible|finalize)$",
     "invoice_action"),
    ("POST", rf"^/_sim/invoices/{_ID}/reschedule$", "reschedule"),
    ("POST", rf"^/_sim/charges/{_ID}/refund$", "refund"),
    ("POST", rf"^/_sim/charges/{_ID}/dispute$", "dispute"),
    ("POST", rf"^/_sim/disputes/{_ID}/close$", "close_dispute"),
    ("POST", r"^/_sim/deliver_all$", "deliver_all"),
    ("POST", r"^/_sim/deliver_due$", "deliver_due"),
    ("POST", r"^/_sim/faults$", "arm_fault"),
    ("POST", r"^/_sim/faults/clear$", "clear_faults"),
    ("GET", r"^/_sim/ledger$", "ledger"),
    ("GET", r"^/_sim/events/pending$", "pending"),
    ("GET", rf"^/_sim/invoices/{_ID}$", "invoice"),
    ("POST", r"^/_sim/realism$", "set_realism"),
    ("GET", r"^/_sim/realism$", "realism"),
]
COMPILED = [(verb, re.compile(rx), name) for verb, rx, name in ROUTES]


class ControlApi:
    def __init__(self, sim: SimulatorCore) -> None:
        self.sim = sim

    def handle(self, req: Request) -> Response:
        method = req.method.upper()
        for verb, rx, name in COMPILED:
            match = rx.match(req.path)
            if verb == method and match:
                try:
                    body = json.loads(req.body or b"{}")
                except ValueError as exc:
                    raise SimError(400, f"control API bodies are JSON: {exc}") from exc
                if not isinstance(body, dict):
                    raise SimError(400, "control API bodies are JSON objects")
                try:
                    return json_response(200, getattr(self, name)(match.groupdict(), body))
                except (KeyError, TypeError, ValueError) as exc:
                    raise SimError(400, f"bad control request: {exc!r}") from exc
        raise SimError(404, f"Unrecognized control URL ({method}: {req.path})", code="resource_missing")

    def _invoice(self, invoice_id: str) -> dict[str, Any]:
        return self.sim.retrieve(invoice_id, expand=["payments"])

    def create_customer(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        return {"id": self.sim.create_customer(body.get("email", "demo@example.com"), body.get("card", "ok"),
                                               name=body.get("name", ""))}

    def set_card(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        self.sim.set_card(args["id"], body["card"])
        return {"id": args["id"], "card": body["card"]}

    def update_payment_method(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        method = self.sim.update_payment_method(args["id"], body.get("card", "ok"),
                                                make_default=bool(body.get("make_default", True)))
        return {"id": args["id"], "payment_method": method}

    def create_subscription(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        sub_id = self.sim.create_subscription(body["customer"], body.get("price", "price_monthly_pro"),
                                              body.get("interval", "month"), amount=int(body.get("amount", 2000)),
                                              currency=body.get("currency", "usd"),
                                              trial_days=int(body.get("trial_days", 0)),
                                              product_name=body.get("product_name"))
        return {"id": sub_id, "latest_invoice": self.sim.get(sub_id)["latest_invoice"]}

    def _subscription(self, sub_id: str, **extra: Any) -> dict[str, Any]:
        return {"id": sub_id, **extra, "subscription": self.sim.retrieve(sub_id)}

    def subscription(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        return self._subscription(args["id"])

    def cancel_subscription(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        self.sim.cancel_subscription(args["id"], at_period_end=bool(body.get("at_period_end", False)))
        return self._subscription(args["id"])

    def pause_subscription(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        self.sim.pause_subscription(args["id"], resumes_at=body.get("resumes_at"),
                                    behavior=body.get("behavior", "void"))
        return self._subscription(args["id"])

    def resume_subscription(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        self.sim.resume_subscription(args["id"])
        return self._subscription(args["id"], latest_invoice=self.sim.get(args["id"])["latest_invoice"])

    def change_price(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        amount = body.get("amount")
        self.sim.change_price(args["id"], body["price"], interval=body.get("interval"),
                              amount=None if amount is None else int(amount))
        return self._subscription(args["id"])

    def end_trial(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        invoice_id = self.sim.end_trial(args["id"], outcome=body.get("outcome", "active"))
        return self._subscription(args["id"], invoice=invoice_id)

    def end_period(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        invoice_id = self.sim.end_period(args["id"])
        return self._subscription(args["id"], invoice=invoice_id)

    def renewal(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        amount = body.get("amount")
        invoice_id = self.sim.create_renewal_invoice(args["id"], None if amount is None else int(amount),
                                                     body.get("currency"), finalize=body.get("finalize", True))
        return {"id": invoice_id, "invoice": self._invoice(invoice_id)}

    def invoice_action(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        action, invoice_id = args["action"], args["id"]
        result: Any = None
        if action == "attempt":
            result = dataclasses.asdict(self.sim.provider_attempt(invoice_id))
        elif action == "customer_pays":
            result = dataclasses.asdict(self.sim.customer_pays(invoice_id, update_card=bool(body.get("update_card"))))
        else:
            getattr(self.sim, action)(invoice_id)
        return {"id": invoice_id, "result": result, "invoice": self._invoice(invoice_id)}

    def reschedule(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        self.sim.reschedule(args["id"], body.get("at"))
        return {"id": args["id"], "invoice": self._invoice(args["id"])}

    def refund(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        return {"id": self.sim.refund(args["id"], body.get("amount"), reason=body.get("reason"))}

    def dispute(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        return {"id": self.sim.open_dispute(args["id"], reason=body.get("reason", "fraudulent"))}

    def close_dispute(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        return self.sim.close_dispute(args["id"], bool(body.get("won")))

    def deliver_all(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        results = self.sim.deliver_all(body.get("order", "created"), body.get("seed"))
        return {"deliveries": [dataclasses.asdict(d) | {"ok": d.ok} for d in results]}

    def deliver_due(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        return {"deliveries": [dataclasses.asdict(d) | {"ok": d.ok} for d in self.sim.deliver_due()]}

    def arm_fault(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        kind, faults = body["kind"], self.sim.faults
        count = int(body.get("count", 1))
        if kind == "timeout":
            faults.timeout(body["pattern"], apply=bool(body.get("apply", True)),
                           hold_seconds=float(body.get("hold_seconds", 5.0)), count=count)
        elif kind == "error_500":
            faults.error_500(body["pattern"], apply=bool(body.get("apply", True)), count=count)
        elif kind == "latency":
            faults.latency(body["pattern"], float(body["seconds"]), count=count)
        elif kind == "rate_limit":
            retry_after = body.get("retry_after")
            faults.rate_limit(body["pattern"], count=count,
                              retry_after=None if retry_after is None else float(retry_after))
        elif kind == "stale_read":
            faults.stale_read(body["object_id"], count)
        elif kind == "duplicate_delivery":
            faults.duplicate_next_delivery(count)
        elif kind == "delay_deliveries":
            faults.delay_deliveries(float(body["seconds"]), body.get("count"))
        else:
            raise SimError(400, f"unknown fault kind {kind!r}")
        return {"armed": kind}

    def clear_faults(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        self.sim.faults.clear()
        return {"cleared": True}

    def set_realism(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        """``{"preset": "off" | "live" | "test", "latency_ms": 150, "latency_spread_ms": 50, "read_rate": 25,
        "write_rate": 25, "burst": null, "retry_after": null, "seed": 0}``, every key optional; an empty
        body switches realism off. Counters and buckets start afresh."""
        self.sim.network.configure(NetworkProfile.from_dict(body))
        return self.sim.network.stats()

    def realism(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        return self.sim.network.stats()

    def ledger(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        ledger = self.sim.ledger
        return {"ledger": ledger, "count": len(ledger), "total": sum(e["amount"] for e in ledger)}

    def pending(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        return {"data": self.sim.pending_events()}

    def invoice(self, args: dict[str, str], body: dict[str, Any]) -> Any:
        return self._invoice(args["id"])
