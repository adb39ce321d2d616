"""JSON shapes of simulator objects, per Stripe API version.

Before ``2025-03-31`` (acacia and older) an invoice carries ``subscription``, ``charge``,
``payment_intent`` and ``paid`` at top level and its lines carry ``price``/``plan`` objects; from
``2025-03-31.basil`` on, the subscription sits under ``parent.subscription_details``, lines carry
``pricing.price_details.price``, payments are InvoicePayment objects (only when
``expand[]=payments``), and charges/payment intents lose their ``invoice`` field.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from tests.verification.fake_stripe.state import Store

NEW_SHAPE_SINCE = "2025-03-31"
DEFAULT_API_VERSION = "2026-10-28.endive"


def is_legacy(api_version: str | None) -> bool:
    return bool(api_version) and api_version[:10] < NEW_SHAPE_SINCE


def list_object(data: list[dict[str, Any]], url: str, *, has_more: bool = False) -> dict[str, Any]:
    return {"object": "list", "data": data, "has_more": has_more, "url": url}


class Renderer:
    def __init__(self, store: Store, *, account: str, hosted_base: str = "https://invoice.stripe.com") -> None:
        self.store = store
        self.account = account
        self.hosted_base = hosted_base

    def render(self, obj: dict[str, Any], api_version: str, expand: Iterable[str] = ()) -> dict[str, Any]:
        expand = set(expand)
        kind = obj["object"]
        method = getattr(self, f"_{kind}")
        out = method(obj, api_version, expand) if kind == "invoice" else method(obj, api_version)
        for field in expand:
            value = out.get(field)
            if isinstance(value, str):
                target = self.store.get(value)
                if target is not None:
                    out[field] = self.render(target, api_version)
        return out

    # ---- invoices
    def _invoice(self, inv: dict[str, Any], version: str, expand: set[str]) -> dict[str, Any]:
        legacy = is_legacy(version)
        remaining = 0 if inv["status"] in ("paid", "void") else inv["amount_due"] - inv["amount_paid"]
        hosted = None if inv["status"] == "draft" else f"{self.hosted_base}/i/{self.account}/{inv['id']}"
        out: dict[str, Any] = {
            "id": inv["id"], "object": "invoice", "account_country": "US", "account_name": "Simulated account",
            "amount_due": inv["amount_due"], "amount_paid": inv["amount_paid"], "amount_remaining": remaining,
            "attempt_count": inv["attempt_count"], "attempted": inv["attempted"], "auto_advance": inv["auto_advance"],
            "billing_reason": inv["billing_reason"], "collection_method": "charge_automatically",
            "created": inv["created"], "currency": inv["currency"], "customer": inv["customer"],
            "customer_email": inv.get("customer_email"), "description": None, "due_date": None,
            "ending_balance": 0 if inv["status"] != "draft" else None,
            "hosted_invoice_url": hosted,
            "invoice_pdf": None, "last_finalization_error": None, "livemode": False, "metadata": {},
            "next_payment_attempt": inv["next_payment_attempt"], "number": inv["number"],
            "period_end": inv["period_end"], "period_start": inv["period_start"], "starting_balance": 0,
            "status": inv["status"], "status_transitions": dict(inv["status_transitions"]),
            "subtotal": inv["amount_due"], "total": inv["amount_due"], "webhooks_delivered_at": inv["created"],
        }
        out["lines"] = list_object([self._line(inv, legacy)], f"/v1/invoices/{inv['id']}/lines")
        out["lines"]["total_count"] = 1
        if legacy:
            out.update({
                "subscription": inv["subscription"], "charge": inv["charge"], "payment_intent": inv["payment_intent"],
                "paid": inv["status"] == "paid", "paid_out_of_band": inv["paid_out_of_band"],
            })
        else:
            out["amount_overpaid"] = 0
            out["confirmation_secret"] = None
            out["parent"] = None if not inv["subscription"] else {
                "type": "subscription_details", "quote_details": None,
                "subscription_details": {"subscription": inv["subscription"], "metadata": {}},
            }
            if "payments" in expand:
                data = [self._invoice_payment_entry(inv, p) for p in inv["payments"]]
                out["payments"] = list_object(data, f"/v1/invoices/{inv['id']}/payments")
        for field in ("customer", "charge", "payment_intent", "subscription"):
            if field in expand and isinstance(out.get(field), str) and self.store.get(out[field]) is not None:
                out[field] = self.render(self.store.get(out[field]), version)
        return out

    def _line(self, inv: dict[str, Any], legacy: bool) -> dict[str, Any]:
        price = self.store.prices.get(inv["price"]) or {}
        line: dict[str, Any] = {
            "id": inv["line_id"], "object": "line_item", "amount": inv["amount_due"], "currency": inv["currency"],
            "description": f"1 × subscription ({inv['price']})", "discountable": True, "livemode": False,
            "metadata": {}, "period": {"start": inv["period_start"], "end": inv["period_end"]}, "quantity": 1,
        }
        if legacy:
            recurring = price.get("recurring") or {"interval": "month", "interval_count": 1}
            line.update({
                "type": "subscription", "subscription": inv["subscription"], "subscription_item": inv["item_id"],
                "proration": False, "price": copy.deepcopy(price) or None,
                "plan": {"id": inv["price"], "object": "plan", "amount": price.get("unit_amount"),
                         "currency": price.get("currency"), "interval": recurring["interval"],
                         "interval_count": recurring["interval_count"], "product": price.get("product")},
            })
        else:
            line.update({
                "invoice": inv["id"],
                "parent": {"type": "subscription_item_details", "invoice_item_details": None,
                           "subscription_item_details": {"subscription": inv["subscription"],
                                                         "subscription_item": inv["item_id"], "invoice_item": None,
                                                         "proration": False}},
                "pricing": {"type": "price_details", "unit_amount_decimal": str(price.get("unit_amount", "")),
                            "price_details": {"price": inv["price"], "product": price.get("product")}},
                "taxes": [],
            })
        return line

    def _invoice_payment_entry(self, inv: dict[str, Any], payment: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": payment["id"], "object": "invoice_payment", "amount_paid": payment["amount_paid"],
            "amount_requested": payment["amount_requested"], "created": payment["created"],
            "currency": inv["currency"], "invoice": inv["id"], "is_default": True, "livemode": False,
            "payment": {"type": "payment_intent", "payment_intent": payment["payment_intent"]},
            "status": payment["status"], "status_transitions": dict(payment["status_transitions"]),
        }

    def invoice_payment(self, payment_id: str) -> dict[str, Any] | None:
        invoice_id = self.store.invoice_payment_index.get(payment_id)
        inv = self.store.get(invoice_id or "", "invoice")
        for payment in (inv or {}).get("payments", []):
            if payment["id"] == payment_id:
                return self._invoice_payment_entry(inv, payment)
        return None

    # ---- payments
    def _payment_intent(self, pi: dict[str, Any], version: str) -> dict[str, Any]:
        out = {
            "id": pi["id"], "object": "payment_intent", "amount": pi["amount"],
            "amount_received": pi["amount_received"], "capture_method": "automatic",
            "confirmation_method": "automatic", "created": pi["created"], "currency": pi["currency"],
            "customer": pi["customer"], "description": "Subscription update", "last_payment_error":
            copy.deepcopy(pi["last_payment_error"]), "latest_charge": pi["latest_charge"], "livemode": False,
            "metadata": {}, "payment_method": pi["payment_method"], "payment_method_types": ["card"],
            "status": pi["status"], "canceled_at": pi.get("canceled_at"),
        }
        if is_legacy(version):
            out["invoice"] = pi["invoice"]
        return out

    def _charge(self, ch: dict[str, Any], version: str) -> dict[str, Any]:
        out = {
            "id": ch["id"], "object": "charge", "amount": ch["amount"],
            "amount_captured": ch["amount"] if ch["paid"] else 0, "amount_refunded": ch["amount_refunded"],
            "balance_transaction": None, "captured": ch["paid"], "created": ch["created"], "currency": ch["currency"],
            "customer": ch["customer"], "description": "Subscription update", "disputed": ch["disputed"],
            "failure_code": ch["failure_code"], "failure_message": ch["failure_message"], "livemode": False,
            "metadata": {}, "outcome": copy.deepcopy(ch["outcome"]), "paid": ch["paid"],
            "payment_intent": ch["payment_intent"], "payment_method": ch["payment_method"],
            "refunded": ch["refunded"], "status": ch["status"],
        }
        if is_legacy(version):
            out["invoice"] = ch["invoice"]
        return out

    def _refund(self, re: dict[str, Any], version: str) -> dict[str, Any]:
        return {"id": re["id"], "object": "refund", "amount": re["amount"], "charge": re["charge"],
                "created": re["created"], "currency": re["currency"], "metadata": {},
                "payment_intent": re["payment_intent"], "reason": re["reason"], "status": "succeeded"}

    def _dispute(self, dp: dict[str, Any], version: str) -> dict[str, Any]:
        return {"id": dp["id"], "object": "dispute", "amount": dp["amount"],
                "balance_transactions": copy.deepcopy(dp.get("balance_transactions") or []),
                "charge": dp["charge"], "created": dp["created"], "currency": dp["currency"],
                "evidence_details": {"due_by": dp["created"] + 7 * 86400, "has_evidence": False,
                                     "past_due": False, "submission_count": 0},
                "is_charge_refundable": False, "livemode": False, "metadata": {},
                "payment_intent": dp["payment_intent"], "reason": dp["reason"], "status": dp["status"]}

    # ---- customers and subscriptions
    def _customer(self, cus: dict[str, Any], version: str) -> dict[str, Any]:
        return {"id": cus["id"], "object": "customer", "created": cus["created"], "currency": "usd",
                "delinquent": cus.get("delinquent", False), "email": cus["email"], "name": cus.get("name") or None,
                "invoice_settings": {"default_payment_method": cus["payment_method"]}, "livemode": False,
                "metadata": {}}

    def _payment_method(self, pm: dict[str, Any], version: str) -> dict[str, Any]:
        return {"id": pm["id"], "object": "payment_method", "billing_details": {}, "card": copy.deepcopy(pm["card"]),
                "created": pm["created"], "customer": pm["customer"], "livemode": False, "metadata": {},
                "type": pm["type"]}

    def _setup_intent(self, seti: dict[str, Any], version: str) -> dict[str, Any]:
        return {"id": seti["id"], "object": "setup_intent", "created": seti["created"], "customer": seti["customer"],
                "last_setup_error": None, "livemode": False, "metadata": {}, "payment_method": seti["payment_method"],
                "payment_method_types": ["card"], "status": seti["status"], "usage": seti["usage"]}

    # ---- prices and products
    def _price(self, price: dict[str, Any], version: str) -> dict[str, Any]:
        return {**copy.deepcopy(price), "billing_scheme": "per_unit", "livemode": False, "metadata": {},
                "lookup_key": None}

    def _product(self, product: dict[str, Any], version: str) -> dict[str, Any]:
        return {"id": product["id"], "object": "product", "active": product["active"], "created": product["created"],
                "description": None, "livemode": False, "metadata": {}, "name": product["name"]}

    def _subscription(self, sub: dict[str, Any], version: str) -> dict[str, Any]:
        price = copy.deepcopy(self.store.prices.get(sub["price"]) or {})
        plan = {"id": sub["price"], "object": "plan", "amount": price.get("unit_amount"),
                "currency": price.get("currency"), "interval": sub["interval"], "interval_count": 1,
                "product": price.get("product")}
        item: dict[str, Any] = {"id": sub["item_id"], "object": "subscription_item", "created": sub["created"],
                                "metadata": {}, "plan": plan, "price": price, "quantity": 1,
                                "subscription": sub["id"]}
        pause = sub.get("pause_collection")
        out: dict[str, Any] = {
            "id": sub["id"], "object": "subscription",
            "billing_cycle_anchor": sub.get("billing_cycle_anchor") or sub["created"],
            "cancel_at": sub.get("cancel_at"), "cancel_at_period_end": bool(sub.get("cancel_at_period_end")),
            "canceled_at": sub.get("canceled_at"), "collection_method": "charge_automatically",
            "created": sub["created"], "currency": price.get("currency"), "customer": sub["customer"],
            "ended_at": sub.get("ended_at"), "latest_invoice": sub["latest_invoice"], "livemode": False,
            "metadata": {}, "pause_collection": dict(pause) if pause else None, "plan": plan, "quantity": 1,
            "start_date": sub["created"], "status": sub["status"], "trial_end": sub.get("trial_end"),
            "trial_start": sub.get("trial_start"),
        }
        if is_legacy(version):
            out["current_period_start"] = sub["current_period_start"]
            out["current_period_end"] = sub["current_period_end"]
        else:
            item["current_period_start"] = sub["current_period_start"]
            item["current_period_end"] = sub["current_period_end"]
        out["items"] = list_object([item], f"/v1/subscription_items?subscription={sub['id']}")
        out["items"]["total_count"] = 1
        return out
