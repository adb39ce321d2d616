"""Acceptance entry points that create rows: a subscription's registration (its first snapshot)
and a renewal invoice's cycle. They share the settle step with `cycle_accept_transition`, so
the root, the receipt and the outbox are written exactly as for any other transition."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import IntegrityError, transaction

from dunning.aggregate import EMPTY_ROOT
from dunning.clock import trusted_now
from dunning.models import DunningCycle
from dunning.services.policies import policy_for_price
from dunning.services.recompute import settle_subscription
from dunning.services.results import Cause, Evidence
from dunning.states import CycleState
from entitlements.profiles import FULL
from subscriptions.models import Customer, Invoice, Subscription


def subscription_register(
    *,
    customer: Customer,
    provider_account: str,
    provider_subscription_id: str,
    price_id: str,
    cause: Cause,
    cohort: str = "default",
    billing_interval: str = "month",
    provider_status: str = "active",
    now: datetime | None = None,
) -> Subscription:
    """Import a subscription, bind its policy and issue generation 1 (FULL). Idempotent."""
    now = now or trusted_now()
    existing = Subscription.objects.filter(provider=customer.provider,
                                           provider_subscription_id=provider_subscription_id).first()
    if existing is not None:
        return existing
    policy = policy_for_price(price_id, cohort=cohort)
    try:
        with transaction.atomic(durable=True):
            subscription = Subscription.objects.create(
                customer=customer, provider=customer.provider, provider_account=provider_account,
                provider_subscription_id=provider_subscription_id, provider_status=provider_status,
                price_id=price_id, cohort=cohort, billing_interval=billing_interval, policy=policy,
                outstanding_cycle_root=EMPTY_ROOT, entitlement_profile=FULL, entitlement_generation=0,
            )
            subscription = Subscription.objects.select_for_update().get(pk=subscription.pk)
            settle_subscription(
                subscription=subscription, changed_cycle=None, now=now, cause=cause, edge="register",
                from_state="", expect=None, evidence=Evidence(), force_new_generation=True,
                first_snapshot=True, notes=[f"bound to policy {policy.identity}"],
            )
            return subscription
    except IntegrityError:
        # A concurrent delivery registered it first; theirs stands.
        return Subscription.objects.get(provider=customer.provider, provider_subscription_id=provider_subscription_id)


@dataclass(frozen=True)
class InvoiceFacts:
    provider_invoice_id: str
    amount_due: int
    currency: str
    status: str = "open"
    amount_paid: int = 0
    attempt_count: int = 0
    next_payment_attempt: datetime | None = None
    period_start: datetime | None = None
    period_end: datetime | None = None
    hosted_invoice_url: str = ""


def cycle_open_for_invoice(
    *,
    subscription_pk: int,
    invoice: InvoiceFacts,
    cause: Cause,
    evidence: Evidence | None = None,
    now: datetime | None = None,
) -> DunningCycle:
    """Mirror a renewal invoice and open its CURRENT cycle. Idempotent per invoice."""
    now = now or trusted_now()
    if invoice.amount_due < 0:
        raise ValueError("amount_due must be a non-negative amount in minor units")
    if len(invoice.currency) != 3:
        raise ValueError(f"currency must be an ISO 4217 code, got {invoice.currency!r}")
    existing = DunningCycle.objects.filter(invoice__provider_invoice_id=invoice.provider_invoice_id).first()
    if existing is not None:
        return existing
    try:
        with transaction.atomic(durable=True):
            subscription = Subscription.objects.select_for_update().select_related("policy").get(pk=subscription_pk)
            mirror = Invoice.objects.create(
                provider=subscription.provider, provider_invoice_id=invoice.provider_invoice_id,
                subscription=subscription, amount_due=invoice.amount_due, amount_paid=invoice.amount_paid,
                currency=invoice.currency.lower(), status=invoice.status, attempt_count=invoice.attempt_count,
                next_payment_attempt=invoice.next_payment_attempt, period_start=invoice.period_start,
                period_end=invoice.period_end, hosted_invoice_url=invoice.hosted_invoice_url,
            )
            cycle = DunningCycle.objects.create(
                subscription=subscription, invoice=mirror, amount=mirror.amount_due, currency=mirror.currency,
                provider_generation=mirror.revision, policy=subscription.policy, state=CycleState.CURRENT,
                opened_at=now,
            )
            settle_subscription(
                subscription=subscription, changed_cycle=cycle, now=now, cause=cause, edge="open_cycle",
                from_state="", expect=None, evidence=evidence or Evidence(),
            )
            return cycle
    except IntegrityError:
        return DunningCycle.objects.get(invoice__provider_invoice_id=invoice.provider_invoice_id)
