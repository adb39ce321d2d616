"""The notification consumer: turns `notification.requested` outbox messages into emails.

Idempotent on the message id (one NotificationDelivery row per message, claimed before the
send), and it re-checks the cycle when it runs: a payment-failed notice or a grace reminder
queued before a recovery is skipped, not sent late.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.mail import EmailMessage
from django.db import IntegrityError, transaction
from django.template.loader import select_template

from dunning.models import DunningCycle, NotificationDelivery, OutboxMessage
from dunning.states import DELINQUENT_STATES, GRACE_PROFILE_STATES, RESTRICTED_PROFILE_STATES, CycleState
from entitlements.profiles import get_profile
from subscriptions.billing.plan_names import plan_label
from subscriptions.models import Subscription

# The cycle states in which each message still tells the truth.
STILL_TRUE_IN: dict[str, frozenset[str]] = {
    "payment_failed": DELINQUENT_STATES,
    "grace_reminder": GRACE_PROFILE_STATES,
    "access_restricted": RESTRICTED_PROFILE_STATES | {CycleState.CANCELED},
    "subscription_canceled": frozenset({CycleState.CANCELED}),
    "payment_recovered": frozenset({CycleState.RECOVERED}),
    "exception_granted": frozenset({CycleState.EXCEPTION_ACTIVE}),
}


def money(amount: int, currency: str) -> str:
    return f"{amount / 100:,.2f} {currency.upper()}"


def notification_deliver(message: OutboxMessage, *, now: datetime) -> NotificationDelivery:
    payload = message.payload
    template = str(payload.get("template", ""))
    delivery = _claim(message, template, now)
    if delivery.status in ("SENT", "SKIPPED"):
        return delivery
    subscription = Subscription.objects.select_related("customer").get(pk=payload["subscription"])
    cycle = (DunningCycle.objects.select_related("invoice").filter(cycle_id=payload.get("cycle")).first()
             if payload.get("cycle") else None)
    skip = _why_skip(template, cycle, subscription)
    if skip:
        return _finish(delivery, "SKIPPED", now, reason=skip)
    context = _context(payload, subscription, cycle, now)
    subject, body = _render(template, int(payload.get("template_generation") or 1), context)
    email = EmailMessage(subject=subject, body=body, to=[subscription.customer.email],
                         from_email=getattr(settings, "DEFAULT_FROM_EMAIL", None),
                         headers={"X-Dunning-Message": str(message.pk),
                                  "X-Dunning-Template": f"{template}@{payload.get('template_generation', 1)}"})
    try:
        email.send(fail_silently=False)
    except Exception as exc:
        _finish(delivery, "FAILED", now, reason=str(exc)[:255])
        raise
    return _finish(delivery, "SENT", now, recipient=subscription.customer.email, subject=subject)


def _claim(message: OutboxMessage, template: str, now: datetime) -> NotificationDelivery:
    try:
        with transaction.atomic():
            return NotificationDelivery.objects.create(message=message, status="SENDING", template=template,
                                                       handled_at=now)
    except IntegrityError:
        delivery = NotificationDelivery.objects.get(message=message)
        if delivery.status == "FAILED":
            delivery.status = "SENDING"
            delivery.save(update_fields=["status"])
        return delivery


def _finish(delivery: NotificationDelivery, status: str, now: datetime, *, reason: str = "", recipient: str = "",
            subject: str = "") -> NotificationDelivery:
    delivery.status, delivery.reason, delivery.handled_at = status, reason, now
    delivery.recipient, delivery.subject = recipient, subject[:255]
    delivery.save(update_fields=["status", "reason", "handled_at", "recipient", "subject"])
    return delivery


def _why_skip(template: str, cycle: DunningCycle | None, subscription: Subscription) -> str:
    if not subscription.customer.email:
        return "customer has no email address"
    if template not in STILL_TRUE_IN:
        return f"no template {template!r}"
    if cycle is not None and cycle.state not in STILL_TRUE_IN[template]:
        return f"no longer true: cycle is {cycle.state}"
    return ""


def _context(payload: dict[str, Any], subscription: Subscription, cycle: DunningCycle | None,
             now: datetime) -> dict[str, Any]:
    spec_profile = get_profile(subscription.entitlement_profile)
    base = getattr(settings, "DUNNING_PUBLIC_BASE_URL", "http://localhost:8000").rstrip("/")
    context: dict[str, Any] = {
        "customer_name": subscription.customer.name or subscription.customer.email,
        "plan": plan_label(subscription),  # the product's name, never a price id
        "access_now": spec_profile.summary,
        "billing_url": f"{base}/billing/",
        "support_email": getattr(settings, "DUNNING_SUPPORT_EMAIL", "support@example.com"),
    }
    if cycle is not None:
        context.update({
            "amount_due": money(cycle.invoice.amount_due - cycle.invoice.amount_paid, cycle.invoice.currency),
            # Only a grace end still ahead is news; one already past would read as a false promise.
            "grace_ends": cycle.grace_expires_at if cycle.grace_expires_at and cycle.grace_expires_at > now else None,
            "next_retry": cycle.next_attempt_at,
            "exception_ends": cycle.exception_expires_at,
            "customer_action_required": cycle.customer_action_required,
        })
    return context


def _render(template: str, generation: int, context: dict[str, Any]) -> tuple[str, str]:
    def pick(part: str):  # noqa: ANN202
        return select_template([f"dunning/email/v{generation}/{template}.{part}.txt",
                                f"dunning/email/{template}.{part}.txt"])

    subject = " ".join(pick("subject").render(context).split())
    return subject, pick("body").render(context).strip() + "\n"
