"""The customer page's "Usage this period" card and the customer's own usage export (issue 19
item 4). Worded for a customer who fears a failed payment costs them their usage: it does not,
usage is recorded and kept whatever the payment or access state, and billed like any invoice."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from subscriptions.billing.wording import day, money
from subscriptions.models import Subscription
from subscriptions.usage_reads import current_period, usage_totals

UNITS = {"tokens": ("token", "tokens"), "calls": ("call", "calls")}
KEPT = ("Your usage is kept whatever happens with a payment: a failed or late payment never deletes usage "
        "already recorded, and you can always download it.")
KEPT_WITH_OPEN_INVOICE = ("It is kept apart from the open invoice above: sorting out that payment will not change "
                          "or lose this usage.")


@dataclass(frozen=True)
class UsageLine:
    label: str
    cost: str


@dataclass(frozen=True)
class UsageCard:
    period: str
    lines: list[UsageLine]
    total: str
    not_yet_invoiced: str
    reassurance: list[str]


def _quantity(metric: str, quantity: int) -> str:
    one, many = UNITS.get(metric, (metric, metric))
    return f"{quantity:,} {one if quantity == 1 else many}"


def usage_card(sub: Subscription, now: datetime, *, open_invoice: bool) -> UsageCard:
    start, end = current_period(sub, now)
    totals = usage_totals(sub, since=start, until=end)
    currency = totals.currency
    lines = [UsageLine(_quantity(m.metric, m.quantity), money(m.cost, currency)) for m in totals.metrics]
    reassurance = [KEPT] + ([KEPT_WITH_OPEN_INVOICE] if open_invoice else [])
    return UsageCard(
        period=f"{day(start, now)} – {day(end - timedelta(microseconds=1), now)}", lines=lines,
        total=money(totals.cost, currency) if lines else "",
        not_yet_invoiced=money(totals.uninvoiced_cost, currency) if lines else "",
        reassurance=reassurance,
    )
