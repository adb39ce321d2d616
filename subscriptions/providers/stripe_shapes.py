"""Stripe's objects and events as the product reads them: pure functions over the JSON Stripe sends.

Reads both invoice shapes: before API version 2025-03-31 (`subscription`, `charge`,
`payment_intent`, `paid` on the invoice) and after it (`parent.subscription_details`,
`payments` of InvoicePayment objects), and both subscription shapes (`current_period_start/end`
on the subscription before 2025-03-31, on each subscription item since). Webhook endpoints are
pinned to different versions in the wild, so event bodies come in either shape too.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from subscriptions.providers.base import (
    EventKind,
    EventSubject,
    ProviderInvoice,
    ProviderPayment,
    ProviderSubscription,
)

NEW_SHAPE_SINCE = "2025-03-31"
# Stripe's event vocabulary, read by `stripe_event_subject`.
PAID_EVENT_TYPES = frozenset({"invoice.paid", "invoice.payment_succeeded"})
PAYMENT_FAILED_EVENT_TYPES = frozenset({"payment_intent.payment_failed", "charge.failed"})
# The events that can mean "the customer has a new payment method" (their bodies name the customer).
PAYMENT_METHOD_EVENT_TYPES = frozenset({"customer.updated", "payment_method.attached", "setup_intent.succeeded"})


def is_legacy_api_version(version: str | None) -> bool:
    return bool(version) and version[:10] < NEW_SHAPE_SINCE


def _ts(value: Any) -> datetime | None:
    return datetime.fromtimestamp(int(value), tz=UTC) if value not in (None, "") else None


def expandable_id(value: Any) -> str | None:
    """An expandable field is either an id or an expanded object."""
    if value is None:
        return None
    if isinstance(value, dict):
        return value.get("id")
    return str(value)


def invoice_subscription_id(raw: dict[str, Any]) -> str | None:
    legacy = expandable_id(raw.get("subscription"))
    if legacy:
        return legacy
    parent = raw.get("parent") or {}
    details = parent.get("subscription_details") or {}
    return expandable_id(details.get("subscription"))


def invoice_payment_refs(raw: dict[str, Any]) -> tuple[str, ...]:
    """Payment references, oldest first. One payment is named once: by its payment intent when
    it has one (the legacy shape also names its charge), so refunds and disputes that cite the
    charge are matched through the payment intent they carry."""
    refs: list[str] = []
    legacy = expandable_id(raw.get("payment_intent")) or expandable_id(raw.get("charge"))
    if legacy:
        refs.append(legacy)
    payments = raw.get("payments") or {}
    for item in payments.get("data", []) if isinstance(payments, dict) else []:
        payment = item.get("payment") or {}
        ref = expandable_id(payment.get("payment_intent")) or expandable_id(payment.get("charge"))
        if ref and ref not in refs:
            refs.append(ref)
    return tuple(refs)


def invoice_price_ids(raw: dict[str, Any]) -> tuple[str, ...]:
    prices: list[str] = []
    for line in (raw.get("lines") or {}).get("data", []):
        pricing = (line.get("pricing") or {}).get("price_details") or {}
        price = (expandable_id(pricing.get("price")) or expandable_id(line.get("price"))
                 or expandable_id(line.get("plan")))
        if price and price not in prices:
            prices.append(price)
    return tuple(prices)


def parse_invoice(raw: dict[str, Any], *, account: str) -> ProviderInvoice:
    return ProviderInvoice(
        id=raw["id"], account=account, subscription_id=invoice_subscription_id(raw),
        customer_id=expandable_id(raw.get("customer")), status=raw.get("status") or "draft",
        amount_due=int(raw.get("amount_due") or 0), amount_paid=int(raw.get("amount_paid") or 0),
        currency=(raw.get("currency") or "").lower(), attempt_count=int(raw.get("attempt_count") or 0),
        next_payment_attempt=_ts(raw.get("next_payment_attempt")), payment_refs=invoice_payment_refs(raw),
        price_ids=invoice_price_ids(raw), billing_reason=raw.get("billing_reason") or "",
        period_start=_ts(raw.get("period_start")), period_end=_ts(raw.get("period_end")),
        hosted_invoice_url=raw.get("hosted_invoice_url") or "", last_decline_code=_embedded_decline(raw), raw=raw,
    )


def _embedded_decline(raw: dict[str, Any]) -> str:
    charge = raw.get("charge")
    if isinstance(charge, dict):
        return charge.get("failure_code") or ((charge.get("outcome") or {}).get("reason") or "")
    return ""


def parse_payment(raw: dict[str, Any]) -> ProviderPayment:
    error = raw.get("last_payment_error") or {}
    outcome = raw.get("outcome") or {}
    decline = (error.get("decline_code") or error.get("code") or raw.get("failure_code")
               or (outcome.get("reason") if raw.get("status") == "failed" else "") or "")
    return ProviderPayment(
        id=raw["id"], object=raw.get("object", ""), status=raw.get("status", ""), amount=int(raw.get("amount") or 0),
        amount_refunded=int(raw.get("amount_refunded") or 0), currency=(raw.get("currency") or "").lower(),
        invoice_id=expandable_id(raw.get("invoice")), decline_code=decline, disputed=bool(raw.get("disputed")), raw=raw,
    )


def _subscription_period(raw: dict[str, Any], items: list[dict[str, Any]]) -> tuple[datetime | None, datetime | None]:
    """Before 2025-03-31 the current period sits on the subscription; since then on each item
    (the latest end among the items, with that item's start)."""
    if raw.get("current_period_end") not in (None, ""):
        return _ts(raw.get("current_period_start")), _ts(raw.get("current_period_end"))
    dated = [i for i in items if i.get("current_period_end") not in (None, "")]
    if not dated:
        return None, None
    latest = max(dated, key=lambda i: int(i["current_period_end"]))
    return _ts(latest.get("current_period_start")), _ts(latest["current_period_end"])


def parse_subscription(raw: dict[str, Any], *, account: str) -> ProviderSubscription:
    """A subscription body in either API shape (customer expanded or an id) as the contract."""
    customer = raw.get("customer") or {}
    items = list((raw.get("items") or {}).get("data", []))
    prices = tuple(p for p in (expandable_id(i.get("price")) or expandable_id(i.get("plan")) for i in items) if p)
    if not prices and raw.get("plan"):
        prices = (expandable_id(raw["plan"]),)
    interval = ""
    for item in items:
        price = item.get("price")
        plan = item.get("plan")
        recurring = ((price.get("recurring") if isinstance(price, dict) else None)
                     or (plan if isinstance(plan, dict) else None) or {})
        interval = recurring.get("interval") or interval
    if not interval and isinstance(raw.get("plan"), dict):
        interval = raw["plan"].get("interval") or ""
    period_start, period_end = _subscription_period(raw, items)
    status = raw.get("status") or ""
    pause = raw.get("pause_collection")
    if isinstance(pause, dict) and pause.get("behavior"):
        pause_behavior, pause_resumes_at = str(pause["behavior"]), _ts(pause.get("resumes_at"))
    elif status == "paused":  # the trial ended without a payment method: paused until resumed
        pause_behavior, pause_resumes_at = "paused", None
    else:
        pause_behavior, pause_resumes_at = "", None
    return ProviderSubscription(
        id=raw["id"], account=account, customer_id=expandable_id(customer) or "",
        customer_email=(customer.get("email") or "") if isinstance(customer, dict) else "",
        status=status, price_ids=prices, interval=interval or "month",
        cancel_at_period_end=bool(raw.get("cancel_at_period_end")),
        current_period_start=period_start, current_period_end=period_end,
        canceled_at=_ts(raw.get("canceled_at")), ended_at=_ts(raw.get("ended_at")), trial_end=_ts(raw.get("trial_end")),
        pause_behavior=pause_behavior, pause_resumes_at=pause_resumes_at, raw=raw,
    )


def stripe_event_subject(event_type: str, payload: dict[str, Any]) -> EventSubject:
    """Stripe's event types in the product's words (`EventKind`)."""
    obj = (payload.get("data") or {}).get("object") or {}
    object_id = obj.get("id") if isinstance(obj.get("id"), str) else ""
    if event_type.startswith("customer.subscription."):
        return EventSubject(EventKind.SUBSCRIPTION, object_id)
    if event_type in PAYMENT_METHOD_EVENT_TYPES:
        return EventSubject(EventKind.PAYMENT_METHOD, object_id)
    if event_type.startswith("invoice."):
        if not object_id:
            return EventSubject(EventKind.IGNORED, detail=f"{event_type} has no invoice id (upcoming invoices are "
                                                            f"previews)")
        return EventSubject(EventKind.INVOICE, object_id, says_paid=event_type in PAID_EVENT_TYPES)
    if event_type.startswith("charge.dispute."):
        return EventSubject(EventKind.DISPUTE, object_id)
    if event_type.startswith(("payment_intent.", "charge.")):
        refs = tuple(r for r in (object_id, expandable_id(obj.get("payment_intent")) or "",
                                        expandable_id(obj.get("charge")) or "") if r)
        return EventSubject(EventKind.PAYMENT, object_id, payment_refs=refs,
                            says_payment_failed=event_type in PAYMENT_FAILED_EVENT_TYPES,
                            says_refunded=event_type == "charge.refunded")
    return EventSubject(EventKind.IGNORED, detail=f"event type {event_type} is not used for dunning")
