"""Customers, subscriptions, invoices and charge attempts (the provider's own state machine).

Invoice statuses: draft → open (finalize) → paid | void | uncollectible; uncollectible → paid | void.
Every successful charge lands in the ledger. Declines leave the invoice open and bump
``attempt_count``; an automatic (provider) attempt also sets ``next_payment_attempt`` from the
smart-retry schedule, or null after a hard decline or the last allowed attempt.
"""

from __future__ import annotations

import calendar
import copy
import functools
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from tests.verification.fake_stripe.errors import CardDeclined, InvalidTransition, not_found

DAY = 86400
HARD_DECLINES = frozenset({
    "incorrect_number", "lost_card", "pickup_card", "stolen_card", "revocation_of_authorization",
    "revocation_of_all_authorizations", "authentication_required", "highest_risk_level", "expired_card",
})
# Stripe reports these as the error `code` itself; every other decline has code `card_declined`.
OWN_CODE_DECLINES = frozenset({"expired_card", "incorrect_cvc", "processing_error", "incorrect_number",
                               "authentication_required"})
DECLINE_MESSAGES = {
    "insufficient_funds": "Your card has insufficient funds.",
    "expired_card": "Your card has expired.",
    "incorrect_cvc": "Your card's security code is incorrect.",
    "incorrect_number": "Your card number is incorrect.",
    "processing_error": "An error occurred while processing your card. Try again in a little bit.",
    "authentication_required": "Your card was declined. This transaction requires authentication.",
}
F = TypeVar("F", bound=Callable[..., Any])


def operation(fn: F) -> F:
    """Run under the state lock; once the outermost operation has released it, auto-deliver events."""

    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        flush = False
        try:
            with self.lock:
                self._depth += 1
                try:
                    return fn(self, *args, **kwargs)
                finally:
                    self._depth -= 1
                    flush = self._depth == 0 and not getattr(self._tls, "suppress_flush", False)
        finally:
            if flush:
                self._flush_auto()

    return wrapper  # type: ignore[return-value]


def add_interval(ts: int, interval: str) -> int:
    if interval == "day":
        return ts + DAY
    if interval == "week":
        return ts + 7 * DAY
    dt = datetime.fromtimestamp(ts, tz=UTC)
    months = 12 if interval == "year" else 1
    month0 = dt.month - 1 + months
    year, month = dt.year + month0 // 12, month0 % 12 + 1
    day = min(dt.day, calendar.monthrange(year, month)[1])
    return int(dt.replace(year=year, month=month, day=day).timestamp())


def to_unix(when: int | float | datetime | None) -> int | None:
    if when is None:
        return None
    if isinstance(when, datetime):
        return int(when.timestamp())
    return int(when)


@dataclass(frozen=True)
class AttemptResult:
    ok: bool
    invoice_id: str
    charge_id: str
    payment_intent_id: str
    attempt_count: int
    next_payment_attempt: int | None
    code: str | None = None
    decline_code: str | None = None
    message: str | None = None


class BillingMixin:
    """Needs from the host: lock, store, _depth, _tls, now_ts(), _emit(), _flush_auto() and the retry settings."""

    # ---- customers
    @operation
    def create_customer(self, email: str, card: str = "ok", *, name: str = "") -> str:
        cus = {"id": self.store.new_id("customer"), "object": "customer", "email": email, "name": name,
               "card": card, "payment_method": self.store.new_id("payment_method"), "created": self.now_ts()}
        self.store.put(cus)
        self._emit("customer.created", cus)
        return cus["id"]

    @operation
    def set_card(self, customer_id: str, behaviour: str) -> None:
        """``"ok"`` or a decline code; a new card means a new payment method id. Emits nothing (a
        test's shortcut); ``update_payment_method`` is what a customer saving a card does."""
        cus = self._get(customer_id, "customer")
        cus["card"] = behaviour
        cus["payment_method"] = self.store.new_id("payment_method")
        self.store.put(cus)

    @operation
    def update_payment_method(self, customer_id: str, card: str = "ok", *, make_default: bool = True) -> str:
        """The customer saves a new card (a SetupIntent, as Stripe's hosted pages do): the payment
        method is attached (``payment_method.attached``), the SetupIntent succeeds
        (``setup_intent.succeeded``) and, with ``make_default``, it becomes the default for invoices
        (``customer.updated`` with the previous default in ``previous_attributes``). ``card`` is
        how the new card will answer charges: ``"ok"`` or a decline code. Returns the new id."""
        cus = self._get(customer_id, "customer")
        now = self.now_ts()
        method = {"id": self.store.new_id("payment_method"), "object": "payment_method", "type": "card",
                  "customer": cus["id"], "behaviour": card, "created": now,
                  "card": {"brand": "visa", "last4": f"{self.store.sequence() % 10000:04d}", "exp_month": 12,
                           "exp_year": datetime.fromtimestamp(now, tz=UTC).year + 3}}
        self.store.put(method)
        setup = {"id": self.store.new_id("setup_intent"), "object": "setup_intent", "customer": cus["id"],
                 "payment_method": method["id"], "status": "succeeded", "usage": "off_session", "created": now}
        self.store.put(setup)
        self._emit("payment_method.attached", method)
        self._emit("setup_intent.succeeded", setup)
        if make_default:
            previous = {"invoice_settings": {"default_payment_method": cus["payment_method"]}}
            cus.update(card=card, payment_method=method["id"])
            self.store.put(cus)
            self._emit("customer.updated", cus, previous=previous)
        return method["id"]

    @operation
    def update_customer(self, customer_id: str, *, email: str | None = None, name: str | None = None) -> None:
        """Change the customer's contact details (``customer.updated``; the payment method stays)."""
        cus = self._get(customer_id, "customer")
        previous = {k: cus.get(k) for k, v in (("email", email), ("name", name)) if v is not None}
        cus.update({k: v for k, v in (("email", email), ("name", name)) if v is not None})
        self.store.put(cus)
        self._emit("customer.updated", cus, previous=previous)

    # ---- subscriptions and invoices
    @operation
    def create_subscription(self, customer_id: str, price_id: str, interval: str = "month", *, amount: int = 2000,
                            currency: str = "usd", trial_days: int = 0, product_name: str | None = None) -> str:
        """Creates the subscription and its first invoice, finalized and charged at once. With
        ``trial_days`` it starts ``trialing`` until ``trial_end``: its first invoice is a $0 one,
        paid without a charge, and the first period is the trial. A price seen for the first time
        gets a product named ``product_name`` (default: made from the price id)."""
        cus = self._get(customer_id, "customer")
        price = self.store.ensure_price(price_id, amount=amount, currency=currency, interval=interval,
                                        product_name=product_name)
        now = self.now_ts()
        trial_end = now + int(trial_days) * DAY if trial_days and int(trial_days) > 0 else None
        sub = {"id": self.store.new_id("subscription"), "object": "subscription", "customer": cus["id"],
               "price": price_id, "interval": price["recurring"]["interval"],
               "item_id": self.store.new_id("subscription_item"), "status": "incomplete", "created": now,
               "current_period_start": now, "current_period_end": trial_end or add_interval(now, interval),
               "latest_invoice": None, "billing_cycle_anchor": trial_end or now, "cancel_at_period_end": False,
               "cancel_at": None, "canceled_at": None, "ended_at": None, "pause_collection": None,
               "trial_start": now if trial_end else None, "trial_end": trial_end}
        if trial_end is not None:
            sub["status"] = "trialing"
        self.store.put(sub)
        self._emit("customer.subscription.created", sub)
        inv = self._new_invoice(sub, amount=0 if trial_end else price["unit_amount"], currency=price["currency"],
                                reason="subscription_create", start=now, end=sub["current_period_end"])
        if trial_end is not None:
            self._settle_free(inv)
            return sub["id"]
        self._finalize(inv)
        self._attempt(inv, cus["card"], automatic=False, source="provider")
        return sub["id"]

    @operation
    def create_renewal_invoice(self, subscription_id: str, amount: int | None = None, currency: str | None = None,
                               *, finalize: bool = True) -> str:
        """The next period's invoice: ``invoice.created`` then (by default) ``invoice.finalized``.
        While collection is paused (``pause_collection``) the invoice follows the pause behaviour
        instead: kept as a draft, marked uncollectible or voided, and never attempted."""
        sub = self._get(subscription_id, "subscription")
        return self._renew(sub, amount=amount, currency=currency, finalize=finalize)["id"]

    @operation
    def finalize(self, invoice_id: str) -> dict[str, Any]:
        inv = self._get(invoice_id, "invoice")
        self._finalize(inv)
        return copy.deepcopy(inv)

    @operation
    def void(self, invoice_id: str) -> dict[str, Any]:
        inv = self._get(invoice_id, "invoice")
        self._void(inv)
        return copy.deepcopy(inv)

    def _void(self, inv: dict[str, Any]) -> None:
        if inv["status"] not in ("open", "uncollectible"):
            raise InvalidTransition(f"You can only void an open or uncollectible invoice; this one is {inv['status']}.",
                                    code="invoice_not_voidable")
        now = self.now_ts()
        pi = self.store.get(inv["payment_intent"] or "", "payment_intent")
        if pi is not None and pi["status"] != "succeeded":
            pi.update(status="canceled", canceled_at=now)
            self.store.put(pi)
        for payment in inv["payments"]:
            if payment["status"] == "open":
                payment["status"] = "canceled"
                payment["status_transitions"]["canceled_at"] = now
        inv.update(status="void", next_payment_attempt=None)
        inv["status_transitions"]["voided_at"] = now
        self.store.put(inv)
        self._emit("invoice.voided", inv)

    @operation
    def mark_uncollectible(self, invoice_id: str) -> dict[str, Any]:
        inv = self._get(invoice_id, "invoice")
        self._mark_uncollectible(inv)
        return copy.deepcopy(inv)

    @operation
    def reschedule(self, invoice_id: str, when: int | float | datetime | None) -> dict[str, Any]:
        """Move the provider's next automatic attempt (``invoice.updated``)."""
        inv = self._get(invoice_id, "invoice")
        if inv["status"] != "open":
            raise InvalidTransition(f"Only an open invoice has a next payment attempt; this one is {inv['status']}.")
        previous = inv["next_payment_attempt"]
        inv["next_payment_attempt"] = to_unix(when)
        self.store.put(inv)
        self._emit("invoice.updated", inv, previous={"next_payment_attempt": previous})
        return copy.deepcopy(inv)

    # ---- payments
    @operation
    def pay_invoice(self, invoice_id: str, *, idempotency_key: str | None = None,
                    paid_out_of_band: bool = False) -> dict[str, Any]:
        """``POST /v1/invoices/{id}/pay``: charges the customer's card; raises CardDeclined (402) on a decline."""
        inv = self._get(invoice_id, "invoice", param="invoice")
        self._check_payable(inv)
        if inv["status"] == "draft":
            self._finalize(inv)
        if paid_out_of_band:
            self._mark_paid(inv, out_of_band=True)
            return copy.deepcopy(inv)
        cus = self._get(inv["customer"], "customer")
        result = self._attempt(inv, cus["card"], automatic=False, source="api", idempotency_key=idempotency_key)
        if not result.ok:
            raise CardDeclined(result.message or "Your card was declined.", code=result.code or "card_declined",
                               decline_code=result.decline_code or "generic_decline", charge_id=result.charge_id,
                               payment_intent_id=result.payment_intent_id)
        return copy.deepcopy(inv)

    @operation
    def provider_attempt(self, invoice_id: str) -> AttemptResult:
        """The provider's own automatic attempt (renewal charge or a scheduled smart retry)."""
        inv = self._get(invoice_id, "invoice")
        if not inv["auto_advance"]:  # collection stopped (subscription canceled) or paused
            raise InvalidTransition("The provider does not collect this invoice automatically (auto_advance is "
                                    f"false); it is {inv['status']}.")
        if inv["status"] == "draft":
            self._finalize(inv)
        if inv["status"] != "open":
            raise InvalidTransition(f"The provider only attempts open invoices; this one is {inv['status']}.")
        cus = self._get(inv["customer"], "customer")
        return self._attempt(inv, cus["card"], automatic=True, source="provider")

    @operation
    def customer_pays(self, invoice_id: str, *, update_card: bool = False) -> AttemptResult:
        """The customer pays (e.g. on the hosted invoice page) with a good card."""
        inv = self._get(invoice_id, "invoice")
        self._check_payable(inv)
        if inv["status"] == "draft":
            self._finalize(inv)
        if update_card:
            self.set_card(inv["customer"], "ok")
        return self._attempt(inv, "ok", automatic=False, source="customer")

    # ---- internals
    def _get(self, object_id: str, kind: str, *, param: str = "id") -> dict[str, Any]:
        obj = self.store.get(object_id, kind)
        if obj is None:
            raise not_found(kind, object_id, param)
        return obj

    def _check_payable(self, inv: dict[str, Any]) -> None:
        if inv["status"] == "paid":
            raise InvalidTransition("Invoice is already paid", code="invoice_already_paid")
        if inv["status"] == "void":
            raise InvalidTransition("This invoice can no longer be paid because it has been voided.",
                                    code="invoice_not_payable")

    def _new_invoice(self, sub: dict[str, Any], *, amount: int, currency: str, reason: str, start: int,
                     end: int, auto_advance: bool = True) -> dict[str, Any]:
        cus = self.store.get(sub["customer"], "customer") or {}
        inv = {
            "id": self.store.new_id("invoice"), "object": "invoice", "customer": sub["customer"],
            "customer_email": cus.get("email"), "subscription": sub["id"], "price": sub["price"],
            "item_id": sub["item_id"], "line_id": self.store.new_id("line_item"), "amount_due": int(amount),
            "amount_paid": 0, "currency": currency.lower(), "status": "draft", "attempt_count": 0, "attempted": False,
            "auto_advance": auto_advance, "next_payment_attempt": None, "period_start": start, "period_end": end,
            "billing_reason": reason, "created": self.now_ts(), "number": None, "payment_intent": None,
            "charge": None, "payments": [], "paid_out_of_band": False,
            "status_transitions": {"finalized_at": None, "marked_uncollectible_at": None, "paid_at": None,
                                   "voided_at": None},
        }
        sub["latest_invoice"] = inv["id"]
        self.store.put(inv)
        self._emit("invoice.created", inv)
        return inv

    def _renew(self, sub: dict[str, Any], *, amount: int | None = None, currency: str | None = None,
               finalize: bool = True, start: int | None = None, reason: str = "subscription_cycle") -> dict[str, Any]:
        """Start the subscription's next period (from its current end, or ``start``) and issue its
        invoice at the subscription's *current* price; the invoice keeps that price for good."""
        price = self.store.prices[sub["price"]]
        start = sub["current_period_end"] if start is None else int(start)
        end = add_interval(start, sub["interval"])
        sub["current_period_start"], sub["current_period_end"] = start, end
        self._expire_pause(sub, start)
        pause = sub.get("pause_collection")
        inv = self._new_invoice(sub, amount=price["unit_amount"] if amount is None else amount,
                                currency=currency or price["currency"], reason=reason, start=start, end=end,
                                auto_advance=not pause)
        self.store.put(sub)
        if finalize and not pause:
            self._finalize(inv)
        elif finalize and pause["behavior"] in ("mark_uncollectible", "void"):
            # Collection is paused: the invoice is issued but never collected (keep_as_draft stays a draft).
            self._finalize(inv)
            if pause["behavior"] == "void":
                self._void(inv)
            else:
                self._mark_uncollectible(inv)
        return inv

    def _expire_pause(self, sub: dict[str, Any], at: int) -> None:
        """A pause of collection whose ``resumes_at`` has come is over (``customer.subscription.updated``)."""
        pause = sub.get("pause_collection")
        if pause and pause.get("resumes_at") is not None and int(pause["resumes_at"]) <= at:
            sub["pause_collection"] = None
            self.store.put(sub)
            self._emit("customer.subscription.updated", sub, previous={"pause_collection": dict(pause)})

    def _settle_free(self, inv: dict[str, Any]) -> None:
        """A $0 invoice (a trial's first): finalized and paid at once, with no payment and no charge."""
        now = self.now_ts()
        inv.update(status="open", number=f"SIM-{self.store.sequence():05d}")
        inv["status_transitions"]["finalized_at"] = now
        self.store.put(inv)
        self._emit("invoice.finalized", inv)
        inv.update(status="paid", amount_paid=0, next_payment_attempt=None)
        inv["status_transitions"]["paid_at"] = now
        self.store.put(inv)
        self._emit("invoice.paid", inv)
        self._emit("invoice.payment_succeeded", inv)

    def _finalize(self, inv: dict[str, Any]) -> None:
        if inv["status"] != "draft":
            raise InvalidTransition(f"This invoice is already finalized (status {inv['status']}).",
                                    code="invoice_not_editable")
        now = self.now_ts()
        pi = {"id": self.store.new_id("payment_intent"), "object": "payment_intent", "amount": inv["amount_due"],
              "amount_received": 0, "currency": inv["currency"], "customer": inv["customer"], "invoice": inv["id"],
              "status": "requires_payment_method", "latest_charge": None, "last_payment_error": None,
              "payment_method": None, "created": now}
        self.store.put(pi)
        payment = {"id": self.store.new_id("invoice_payment"), "payment_intent": pi["id"], "status": "open",
                   "amount_paid": None, "amount_requested": inv["amount_due"], "created": now,
                   "status_transitions": {"canceled_at": None, "paid_at": None}}
        self.store.invoice_payment_index[payment["id"]] = inv["id"]
        inv.update(status="open", number=f"SIM-{self.store.sequence():05d}", payment_intent=pi["id"])
        inv["payments"].append(payment)
        inv["status_transitions"]["finalized_at"] = now
        self.store.put(inv)
        self._emit("invoice.finalized", inv)

    def _mark_uncollectible(self, inv: dict[str, Any]) -> None:
        if inv["status"] != "open":
            raise InvalidTransition(f"You can only mark an open invoice uncollectible; this one is {inv['status']}.",
                                    code="invoice_not_open")
        inv.update(status="uncollectible", next_payment_attempt=None)
        inv["status_transitions"]["marked_uncollectible_at"] = self.now_ts()
        self.store.put(inv)
        self._emit("invoice.marked_uncollectible", inv)

    def _mark_paid(self, inv: dict[str, Any], *, out_of_band: bool) -> None:
        inv.update(status="paid", amount_paid=inv["amount_due"], next_payment_attempt=None,
                   paid_out_of_band=out_of_band)
        inv["status_transitions"]["paid_at"] = self.now_ts()
        self.store.put(inv)
        self._emit("invoice.paid", inv)
        self._set_subscription_status(inv, "active")

    def _attempt(self, inv: dict[str, Any], behaviour: str, *, automatic: bool, source: str,
                 idempotency_key: str | None = None) -> AttemptResult:
        now = self.now_ts()
        pi = self._get(inv["payment_intent"], "payment_intent")
        cus = self._get(inv["customer"], "customer")
        amount = inv["amount_due"] - inv["amount_paid"]
        charge = {"id": self.store.new_id("charge"), "object": "charge", "amount": amount,
                  "currency": inv["currency"], "customer": cus["id"], "invoice": inv["id"], "payment_intent": pi["id"],
                  "payment_method": cus["payment_method"], "created": now, "amount_refunded": 0, "refunded": False,
                  "disputed": False}
        inv["attempt_count"] += 1
        inv["attempted"] = True
        inv["charge"] = charge["id"]
        pi.update(latest_charge=charge["id"], payment_method=cus["payment_method"])
        if behaviour == "ok":
            charge.update(status="succeeded", paid=True, failure_code=None, failure_message=None,
                          outcome={"type": "authorized", "network_status": "approved_by_network", "reason": None,
                                   "risk_level": "normal", "seller_message": "Payment complete."})
            pi.update(status="succeeded", amount_received=amount, last_payment_error=None)
            for payment in inv["payments"]:
                if payment["payment_intent"] == pi["id"]:
                    payment.update(status="paid", amount_paid=amount)
                    payment["status_transitions"]["paid_at"] = now
            self.store.put(charge)
            self.store.put(pi)
            self.store.record_charge({
                "id": charge["id"], "payment_intent": pi["id"], "invoice": inv["id"], "customer": cus["id"],
                "amount": amount, "currency": inv["currency"], "idempotency_key": idempotency_key, "created": now,
                "refunded": 0, "dispute": None, "dispute_status": None,
                "source": source,
            }, retention=self.idempotency_retention, now=now)
            self._emit("charge.succeeded", charge)
            self._emit("payment_intent.succeeded", pi)
            inv.update(status="paid", amount_paid=inv["amount_due"], next_payment_attempt=None)
            inv["status_transitions"]["paid_at"] = now
            self.store.put(inv)
            self._emit("invoice.paid", inv)
            self._emit("invoice.payment_succeeded", inv)
            self._set_subscription_status(inv, "active")
            return AttemptResult(True, inv["id"], charge["id"], pi["id"], inv["attempt_count"], None)
        code = behaviour if behaviour in OWN_CODE_DECLINES else "card_declined"
        message = DECLINE_MESSAGES.get(behaviour, "Your card was declined.")
        charge.update(status="failed", paid=False, failure_code=code, failure_message=message,
                      outcome={"type": "issuer_declined", "network_status": "declined_by_network",
                               "reason": behaviour, "risk_level": "normal",
                               "seller_message": "The bank did not return any further details with this decline."})
        pi.update(status="requires_payment_method", last_payment_error={
            "type": "card_error", "code": code, "decline_code": behaviour, "message": message,
            "charge": charge["id"], "payment_method": {"id": cus["payment_method"], "object": "payment_method"}})
        exhausted = inv["attempt_count"] >= self.max_attempts
        if automatic:
            inv["next_payment_attempt"] = self._next_retry(inv, behaviour, now, exhausted)
        self.store.put(charge)
        self.store.put(pi)
        self.store.put(inv)
        self._emit("charge.failed", charge)
        self._emit("payment_intent.payment_failed", pi)
        self._emit("invoice.payment_failed", inv)
        if inv["billing_reason"] != "subscription_create":
            self._set_subscription_status(inv, "past_due")
        if automatic and exhausted:
            if self.mark_uncollectible_after_attempts:
                self._mark_uncollectible(inv)
            if self.subscription_status_after_exhaustion != "past_due":
                self._set_subscription_status(inv, self.subscription_status_after_exhaustion)
        return AttemptResult(False, inv["id"], charge["id"], pi["id"], inv["attempt_count"],
                             inv["next_payment_attempt"], code, behaviour, message)

    def _next_retry(self, inv: dict[str, Any], behaviour: str, now: int, exhausted: bool) -> int | None:
        schedule = list(self.retry_schedule)
        if behaviour in HARD_DECLINES or exhausted or not schedule:
            return None
        return now + int(schedule[min(inv["attempt_count"] - 1, len(schedule) - 1)])

    def _set_subscription_status(self, inv: dict[str, Any], status: str) -> None:
        sub = self.store.get(inv.get("subscription") or "", "subscription")
        if sub is None or sub["status"] == status or sub["status"] == "canceled":
            return
        if status == "active" and any(  # other unpaid invoices keep it past due
                o["status"] == "open" and o["id"] != inv["id"] and o["attempt_count"] > 0
                for o in self.store.all_of("invoice") if o["subscription"] == sub["id"]):
            return
        previous = sub["status"]
        sub["status"] = status
        if status == "canceled":
            sub["canceled_at"] = self.now_ts()
        self.store.put(sub)
        self._emit("customer.subscription.updated", sub, previous={"status": previous})
