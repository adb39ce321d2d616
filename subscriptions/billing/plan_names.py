"""The name a customer knows their plan by: the product name of its price, never a raw price id
(SPEC §12). The contract line stores it on the subscription when it reads a plan
(`Subscription.plan_name`), so pages and emails never ask the provider; without one the words
fall back to the billing interval ("monthly")."""

from __future__ import annotations

from subscriptions.models import BillingInterval, Subscription

INTERVAL_WORDS = {BillingInterval.MONTH: "monthly", BillingInterval.YEAR: "annual"}


def interval_words(sub: Subscription) -> str:
    return INTERVAL_WORDS.get(sub.billing_interval, "")


def product_name(sub: Subscription) -> str:
    return sub.plan_name.strip()


def plan_label(sub: Subscription) -> str:
    """"Pro" (the product), else "monthly" / "annual": for "your … plan" and "your … subscription"."""
    return product_name(sub) or interval_words(sub)
