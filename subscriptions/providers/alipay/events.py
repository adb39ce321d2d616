"""Alipay's asynchronous notifications as the product stores and reads them.

A notification is a form-encoded POST signed with Alipay's RSA2 key. Verified, it is stored as an
event shaped like every provider event: `id` is Alipay's `notify_id` (a redelivery carries the
same one, so the inbox writes it once), `type` is the notification type with the trade status
(`trade_status_sync.TRADE_SUCCESS`), `account` the merchant's `app_id`, `data.object` the form
itself with the object's `id` (the `out_trade_no`, or the `agreement_no`) and, for a trade, the
renewal order it belongs to (`order_no`, looked up when the notification arrived).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import parse_qsl

from subscriptions.providers.alipay.money import yuan_to_fen
from subscriptions.providers.alipay.records import AlipayAgreement, AlipayTrade
from subscriptions.providers.base import EventKind, EventSubject, WebhookVerificationError

TRADE_SYNC = "trade_status_sync"
AGREEMENT_SIGNED = "dut_user_sign"
AGREEMENT_UNSIGNED = "dut_user_unsign"
PAID_EVENT_TYPES = frozenset({f"{TRADE_SYNC}.TRADE_SUCCESS", f"{TRADE_SYNC}.TRADE_FINISHED"})
# Alipay states times in Beijing time, without a zone.
BEIJING = timezone(timedelta(hours=8))
REQUIRED = {
    TRADE_SYNC: ("notify_id", "notify_time", "app_id", "out_trade_no", "trade_status", "total_amount"),
    AGREEMENT_SIGNED: ("notify_id", "notify_time", "app_id", "agreement_no"),
    AGREEMENT_UNSIGNED: ("notify_id", "notify_time", "app_id", "agreement_no"),
}
FIELD_MAX_LENGTH = 1024


def parse_form(payload: bytes) -> dict[str, str]:
    """The notification's fields. A body that is not one well-formed UTF-8 form, or names a field
    twice, is refused whole: a signed form is only meaningful as exactly what was signed."""
    try:
        text = payload.decode("utf-8")
        pairs = parse_qsl(text, keep_blank_values=True, strict_parsing=True, errors="strict")
    except (UnicodeDecodeError, ValueError) as exc:
        raise WebhookVerificationError(f"body is not a UTF-8 form: {exc}", code="MALFORMED_PAYLOAD") from exc
    form: dict[str, str] = {}
    for key, value in pairs:
        if key in form:
            raise WebhookVerificationError(f"field {key!r} appears twice", code="MALFORMED_PAYLOAD")
        if "\x00" in key or "\x00" in value or len(value) > FIELD_MAX_LENGTH or len(key) > 64:
            raise WebhookVerificationError(f"field {key[:64]!r} is not a value a notification carries",
                                           code="MALFORMED_PAYLOAD")
        form[key] = value
    return form


def check_signature_fields(form: dict[str, str]) -> None:
    if not form.get("sign"):
        raise WebhookVerificationError("notification has no sign", code="SIGNATURE_MISSING")
    if form.get("sign_type", "RSA2") != "RSA2":
        raise WebhookVerificationError(f"sign_type {form.get('sign_type')[:16]!r}; only RSA2 is accepted",
                                       code="SIGNATURE_MALFORMED")


def envelope(form: dict[str, str]) -> dict[str, Any]:
    """The stored event for a verified notification (see the module docstring)."""
    notify_type = form.get("notify_type", "")
    missing = [name for name in REQUIRED.get(notify_type, ("notify_id", "notify_time", "app_id")) if not form.get(name)]
    if missing:
        raise WebhookVerificationError(f"{notify_type or 'notification'} lacks {', '.join(missing)}",
                                       code="MALFORMED_PAYLOAD")
    obj: dict[str, Any] = {k: v for k, v in form.items() if k not in ("sign", "sign_type")}
    if notify_type == TRADE_SYNC:
        event_type = f"{TRADE_SYNC}.{form['trade_status']}"
        trade = AlipayTrade.objects.select_related("order").filter(out_trade_no=form["out_trade_no"]).first()
        obj.update(id=form["out_trade_no"], object="alipay_trade", order_no=trade.order.order_no if trade else "")
    elif notify_type in (AGREEMENT_SIGNED, AGREEMENT_UNSIGNED):
        event_type = notify_type
        obj.update(id=form["agreement_no"], object="alipay_agreement")
    else:
        event_type = notify_type or "unknown"
        obj.update(id=form.get("notify_id", ""), object="alipay_notification")
    created = notify_time(form["notify_time"])
    if created is None:
        raise WebhookVerificationError("notify_time is not a time (YYYY-MM-DD HH:MM:SS)", code="MALFORMED_PAYLOAD")
    return {"id": form["notify_id"], "type": event_type, "account": form["app_id"],
            "created": int(created.timestamp()), "data": {"object": obj}}


def notify_time(text: str) -> datetime | None:
    try:
        return datetime.strptime(text, "%Y-%m-%d %H:%M:%S").replace(tzinfo=BEIJING)
    except ValueError:
        return None


def notification_problem(event: dict[str, Any], *, app_id: str) -> tuple[str, str] | None:
    """Seed 003: after the signature, the merchant, the order, the amount and the currency must be
    what we sent; anything else is quarantined and never opens access."""
    obj = event["data"]["object"]
    if event.get("account") != app_id:
        return "UNKNOWN_APP_ID", f"notification for app_id {str(event.get('account'))[:32]!r}, expected {app_id!r}"
    if event["type"].startswith(f"{TRADE_SYNC}."):
        trade = AlipayTrade.objects.select_related("order").filter(out_trade_no=obj["id"]).first()
        if trade is None:
            return "UNKNOWN_OUT_TRADE_NO", f"no deduction {obj['id'][:64]!r} was sent by us"
        try:
            amount = yuan_to_fen(obj.get("total_amount", ""))
        except ValueError:
            return "AMOUNT_MISMATCH", f"total_amount {obj.get('total_amount', '')[:32]!r} is not an amount in yuan"
        if amount != trade.amount:
            return "AMOUNT_MISMATCH", f"notified {amount} fen for {trade.out_trade_no}; we sent {trade.amount} fen"
        currency = (obj.get("trans_currency") or obj.get("currency") or trade.order.currency).lower()
        if currency != trade.order.currency:
            return "CURRENCY_MISMATCH", f"notified {currency[:8]!r}; order {trade.order.order_no} is in " \
                                        f"{trade.order.currency}"
        return None
    if event["type"] in (AGREEMENT_SIGNED, AGREEMENT_UNSIGNED):
        known = AlipayAgreement.objects.filter(agreement_no=obj["id"]).exists() or (
            bool(obj.get("external_agreement_no"))
            and AlipayAgreement.objects.filter(external_agreement_no=obj["external_agreement_no"]).exists())
        if not known:
            return "UNKNOWN_AGREEMENT", f"no agreement {obj['id'][:64]!r} was signed with us"
        return None
    return "UNKNOWN_NOTIFY_TYPE", f"notify_type {str(obj.get('notify_type', ''))[:64]!r} is not one we subscribe to"


def event_subject(event_type: str, payload: dict[str, Any]) -> EventSubject:
    obj = (payload.get("data") or {}).get("object") or {}
    if event_type.startswith(f"{TRADE_SYNC}."):
        if not obj.get("order_no"):
            return EventSubject(EventKind.IGNORED, detail=f"trade {obj.get('id', '')} belongs to no renewal order")
        return EventSubject(EventKind.INVOICE, str(obj["order_no"]), says_paid=event_type in PAID_EVENT_TYPES)
    if event_type in (AGREEMENT_SIGNED, AGREEMENT_UNSIGNED):
        return EventSubject(EventKind.SUBSCRIPTION, str(obj.get("id", "")))
    return EventSubject(EventKind.IGNORED, detail=f"Alipay notification {event_type} is not used for dunning")
