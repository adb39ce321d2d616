"""The merchant's side of Alipay renewals: Alipay bills nobody, so we open each period's renewal
order and send its first deduction ourselves. Later deductions are the dunning retries, sent by
the product's local-retry path through `AlipayProvider.pay_invoice`.

Each function is safe to run again: an order is unique per agreement and period, a deduction per
attempt key, and an answered deduction is never sent again.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction

from subscriptions.models import Subscription
from subscriptions.providers.alipay.adapter import AlipayProvider
from subscriptions.providers.alipay.records import (
    FAILED_TRADE_STATUSES,
    PAID_TRADE_STATUSES,
    AlipayAgreement,
    AlipayRenewalOrder,
    AlipayTrade,
)
from subscriptions.providers.base import ProviderError

ENDED_STATUSES = ("canceled", "incomplete_expired")


def agreement_begin(*, customer_email: str, price_id: str, app_id: str, plans: dict, now: datetime,
                    external_agreement_no: str = "") -> AlipayAgreement:
    """The terms of an agreement the customer is about to sign in Alipay (our external number is
    what Alipay gives back with its own). The first period starts now: the sign-and-pay flow
    collects it."""
    plan = plans.get(price_id)
    if plan is None:
        raise ValueError(f"no Alipay plan {price_id!r}")
    return AlipayAgreement.objects.create(
        external_agreement_no=external_agreement_no or f"EA{uuid.uuid4().hex[:24]}", app_id=app_id,
        customer_email=customer_email, price_id=price_id, amount=int(plan["amount"]),
        currency=str(plan.get("currency", "cny")), interval=str(plan.get("interval", "month")), period_start=now,
        period_end=now + period_length(str(plan.get("interval", "month"))), created_at=now,
    )


def period_length(interval: str) -> timedelta:
    return timedelta(days=365) if interval == "year" else timedelta(days=30)


def order_number(agreement: AlipayAgreement, period_start: datetime) -> str:
    return f"RN{period_start:%Y%m%d}{agreement.pk:010d}"


def open_due_orders(*, now: datetime, limit: int = 500) -> list[AlipayRenewalOrder]:
    """Open the renewal order of every signed agreement whose period has ended, and move the
    agreement to its next period. An agreement whose contract ended, or that the customer
    revoked (its subscription is set to end at the period end), renews no more."""
    opened: list[AlipayRenewalOrder] = []
    due = (AlipayAgreement.objects.exclude(agreement_no="").filter(period_end__lte=now, merchant_canceled_at=None)
           .order_by("period_end", "pk")[:limit])
    for agreement in due:
        sub = Subscription.objects.filter(provider="alipay", provider_subscription_id=agreement.agreement_no).first()
        if sub is None or sub.provider_status in ENDED_STATUSES or sub.cancel_at_period_end:
            continue
        order = _open_order(agreement)
        if order is not None:
            opened.append(order)
    return opened


def _open_order(agreement: AlipayAgreement) -> AlipayRenewalOrder | None:
    with transaction.atomic():
        locked = AlipayAgreement.objects.select_for_update().get(pk=agreement.pk)
        start = locked.period_end
        end = start + period_length(locked.interval)
        try:
            with transaction.atomic():
                order = AlipayRenewalOrder.objects.create(
                    order_no=order_number(locked, start), agreement=locked, amount=locked.amount,
                    currency=locked.currency, period_start=start, period_end=end, created_at=start)
        except IntegrityError:
            return None  # another worker opened this period's order
        locked.period_start, locked.period_end = start, end
        locked.save(update_fields=["period_start", "period_end"])
    return order


def renewal_key(order: AlipayRenewalOrder) -> str:
    return f"alipay-renewal:{order.order_no}"


def renewal_charge(provider: AlipayProvider, order: AlipayRenewalOrder) -> str:
    """Send the period's first deduction once (persisted before it is sent). Returns what happened
    in a word; whatever it was, the order is then read back as evidence by the caller."""
    try:
        provider.pay_invoice(order.order_no, idempotency_key=renewal_key(order))
    except ProviderError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "paid"


def unanswered_renewals(*, limit: int = 500) -> list[AlipayRenewalOrder]:
    """Orders whose first deduction has no outcome yet (a timeout, a crash between persist and
    send, a payment still processing). `renewal_charge` asks about each again before anything."""
    final = list(PAID_TRADE_STATUSES | FAILED_TRADE_STATUSES)
    keys = (AlipayTrade.objects.exclude(status__in=final).filter(idempotency_key__startswith="alipay-renewal:")
            .order_by("sent_at").values_list("order_id", flat=True)[:limit])
    return list(AlipayRenewalOrder.objects.select_related("agreement").filter(pk__in=list(keys)))
