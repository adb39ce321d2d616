"""The simulator's object store: current objects, their full version history, prices and the ledger.

Objects are kept in an internal, API-version-neutral form (plain dicts with an ``object`` key);
``rendering`` turns them into the JSON Stripe would return for a given API version. Every ``put``
appends a deep copy to the object's history, so a stale read can serve an earlier version.
The ledger holds one entry per *successful* charge: it is the monetary truth tests check.
"""

from __future__ import annotations

import copy
import itertools
import uuid
from typing import Any

PREFIXES = {
    "customer": "cus", "subscription": "sub", "subscription_item": "si", "invoice": "in", "line_item": "il",
    "payment_intent": "pi", "charge": "ch", "dispute": "dp", "refund": "re", "event": "evt",
    "invoice_payment": "inpay", "price": "price", "product": "prod", "payment_method": "pm", "request": "req",
    "setup_intent": "seti",
}
# Words a price id carries that say how often it bills, not what the product is.
_INTERVAL_WORDS = frozenset({"price", "plan", "monthly", "annual", "yearly", "month", "year", "weekly", "daily"})


def product_name_for(price_id: str) -> str:
    """A readable product name made from a price id when none is given ("price_monthly_pro" → "Pro")."""
    words = [w for w in price_id.replace("-", "_").split("_") if w and w.lower() not in _INTERVAL_WORDS]
    return " ".join(w.capitalize() for w in words) or "Subscription"



class Store:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.versions: dict[str, list[dict[str, Any]]] = {}
        self.prices: dict[str, dict[str, Any]] = {}
        self.ledger: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.events_by_id: dict[str, dict[str, Any]] = {}
        self.invoice_payment_index: dict[str, str] = {}  # inpay id -> invoice id
        self._seq = itertools.count(1)

    # ---- ids
    def new_id(self, kind: str) -> str:
        prefix = PREFIXES.get(kind, kind)
        return f"{prefix}_{next(self._seq):05d}{uuid.uuid4().hex[:14]}"

    def sequence(self) -> int:
        return next(self._seq)

    # ---- objects
    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.objects[obj["id"]] = obj
        self.versions.setdefault(obj["id"], []).append(copy.deepcopy(obj))
        return obj

    def get(self, object_id: str, kind: str | None = None) -> dict[str, Any] | None:
        obj = self.objects.get(object_id)
        if obj is None or (kind is not None and obj.get("object") != kind):
            return None
        return obj

    def history(self, object_id: str) -> list[dict[str, Any]]:
        return copy.deepcopy(self.versions.get(object_id, []))

    def previous_version(self, object_id: str) -> dict[str, Any] | None:
        """The version before the latest change (the latest one if there was no change yet)."""
        versions = self.versions.get(object_id) or []
        if not versions:
            return None
        return copy.deepcopy(versions[-2] if len(versions) >= 2 else versions[-1])

    def all_of(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects.values() if o.get("object") == kind]

    # ---- prices
    def ensure_price(self, price_id: str, *, amount: int, currency: str, interval: str,
                     product_name: str | None = None) -> dict[str, Any]:
        """A price and its product (named ``product_name``, else after the price id) the first time
        it is used; a known price keeps its amount, interval and product."""
        price = self.prices.get(price_id)
        if price is None:
            product = {"id": self.new_id("product"), "object": "product", "name": product_name or
                       product_name_for(price_id), "active": True, "created": 0}
            self.put(product)
            price = {"id": price_id, "object": "price", "unit_amount": int(amount), "currency": currency.lower(),
                     "recurring": {"interval": interval, "interval_count": 1}, "product": product["id"],
                     "type": "recurring", "active": True, "nickname": None}
            self.prices[price_id] = price
        return price

    # ---- ledger
    def record_charge(self, entry: dict[str, Any], *, retention: float, now: float) -> dict[str, Any]:
        key = entry.get("idempotency_key")
        if key:
            for other in self.ledger:
                if other.get("idempotency_key") == key and now - other["created"] <= retention:
                    raise AssertionError(f"simulator invariant broken: a second charge for idempotency key {key!r}")
        self.ledger.append(entry)
        return entry

    def ledger_entry(self, charge_id: str) -> dict[str, Any] | None:
        return next((e for e in self.ledger if e["id"] == charge_id), None)
