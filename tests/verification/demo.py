"""The demo data set: a few subscriptions in telling states, built only through the acceptance
service, so everything the admin shows (receipts, snapshots, history) is real.

Receipts here are marked `"demo": true`: the demo has no payment provider behind it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q

from dunning.acceptance.inputs import Cause, Evidence, Expect, FactSpec, InvoiceUpdate
from dunning.acceptance.opening import InvoiceFacts, cycle_open_for_invoice, subscription_register
from dunning.acceptance.transitions import cycle_accept_transition
from dunning.clock import trusted_now
from dunning.evidence.receipts import receipt_record
from dunning.models import DunningCycle
from subscriptions.models import Customer, Subscription

DEMO_ACCOUNT = "acct_demo"
DEMO_ALIPAY_APP = "2021000000000001"  # the shipped alipay-monthly policy's app_id
DEMO_ALIPAY_AGREEMENT = "20261101000000000001"
CAUSE = Cause.system("load_demo")


class DemoRefused(RuntimeError):
    pass


@dataclass
class DemoCycle:
    cycle: DunningCycle
    now: datetime

    def step(self, edge: str, *, evidence: Evidence | None = None, cause: Cause = CAUSE, **params: Any) -> None:
        fresh = DunningCycle.objects.select_related("invoice", "subscription", "pending_attempt").get(pk=self.cycle.pk)
        result = cycle_accept_transition(cycle_pk=fresh.pk, edge=edge, expect=Expect.from_cycle(fresh), cause=cause,
                                         evidence=evidence, params=params, now=self.now)
        if not result.accepted:
            raise DemoRefused(f"demo step {edge} refused: {result.reason} {result.detail}")
        self.cycle = DunningCycle.objects.select_related("invoice").get(pk=fresh.pk)

    def receipt(self, status: str, **invoice_fields: Any) -> Evidence:
        inv = self.cycle.invoice
        body = {"id": inv.provider_invoice_id, "object": "invoice", "status": status, "amount_due": inv.amount_due,
                "currency": inv.currency, "demo": True}
        receipt = receipt_record(object_type="invoice", body=body, invoice=inv,
                                 account=self.cycle.subscription.provider_account, fetched_at=self.now)
        facts: tuple[FactSpec, ...] = ()
        if status == "paid":
            facts = (FactSpec(kind="PAYMENT_SUCCEEDED", amount=inv.amount_due, currency=inv.currency,
                              dedupe_key=f"demo:paid:{inv.provider_invoice_id}", occurred_at=self.now),)
        update = InvoiceUpdate(
            status=status, amount_due=inv.amount_due, amount_paid=inv.amount_due if status == "paid" else 0,
            attempt_count=invoice_fields.get("attempt_count", inv.attempt_count),
            next_payment_attempt=invoice_fields.get("next_payment_attempt"),
        )
        return Evidence(receipt=receipt, invoice=update, facts=facts)

    def fail(self, decline_code: str) -> None:
        self.step("record_failure", decline_code=decline_code, evidence=self.receipt("open", attempt_count=1))
        self.step("start_grace")

    def restrict(self) -> None:
        self.now = self.cycle.grace_expires_at + timedelta(minutes=1)
        self.step("expire_grace")
        self.step("begin_restriction", evidence=self.receipt("open"))
        self.step("complete_restriction")


def _subscription(email: str, name: str, sub_id: str, price: str, interval: str, now: datetime, *,
                  provider: str = "stripe", account: str = DEMO_ACCOUNT, customer_id: str = "") -> Subscription:
    customer, _ = Customer.objects.get_or_create(
        provider=provider, provider_customer_id=customer_id or f"cus_{sub_id.removeprefix('sub_')}",
        defaults={"email": email, "name": name},
    )
    return subscription_register(customer=customer, provider_account=account, provider_subscription_id=sub_id,
                                 price_id=price, billing_interval=interval, cause=CAUSE, now=now)


def _invoice(sub: Subscription, invoice_id: str, amount: int, opened: datetime, currency: str = "usd") -> DemoCycle:
    cycle = cycle_open_for_invoice(
        subscription_pk=sub.pk, cause=CAUSE, now=opened,
        invoice=InvoiceFacts(provider_invoice_id=invoice_id, amount_due=amount, currency=currency,
                             period_start=opened, period_end=opened + timedelta(days=30),
                             hosted_invoice_url="" if sub.provider == "alipay"
                             else f"https://invoice.example/{invoice_id}"),
    )
    return DemoCycle(cycle, opened)


def load_demo(now: datetime | None = None) -> list[Subscription]:
    """Idempotent: returns the demo subscriptions, creating them the first time."""
    now = now or trusted_now()
    existing = list(Subscription.objects.filter(Q(provider_subscription_id__startswith="sub_demo_")
                                                | Q(provider="alipay", provider_subscription_id=DEMO_ALIPAY_AGREEMENT))
                    .select_related("customer").order_by("pk"))
    if existing:
        return existing
    made = []

    healthy = _subscription("ada@example.com", "Ada Healthy", "sub_demo_healthy", "price_monthly_pro", "month",
                            now - timedelta(days=60))
    paid = _invoice(healthy, "in_demo_healthy_nov", 4900, now - timedelta(days=2))
    paid.step("recover", evidence=paid.receipt("paid", attempt_count=1))
    made.append(healthy)

    grace = _subscription("grace@example.com", "Grace Period", "sub_demo_grace", "price_monthly_pro", "month",
                          now - timedelta(days=45))
    g = _invoice(grace, "in_demo_grace_nov", 4900, now - timedelta(days=2))
    g.fail("insufficient_funds")
    g.step("schedule_retry", next_attempt_at=now + timedelta(days=1),
           evidence=g.receipt("open", attempt_count=1, next_payment_attempt=now + timedelta(days=1)))
    made.append(grace)

    restricted = _subscription("rita@example.com", "Rita Restricted", "sub_demo_restricted", "price_monthly_team",
                               "month", now - timedelta(days=120))
    october = _invoice(restricted, "in_demo_restricted_oct", 9900, now - timedelta(days=40))
    october.fail("insufficient_funds")
    october.restrict()
    november = _invoice(restricted, "in_demo_restricted_nov", 9900, now - timedelta(days=10))
    november.fail("expired_card")
    november.restrict()
    made.append(restricted)

    conflict = _subscription("connor@example.com", "Connor Conflict", "sub_demo_conflict", "price_monthly_pro",
                             "month", now - timedelta(days=90))
    c = _invoice(conflict, "in_demo_conflict_nov", 4900, now - timedelta(days=3))
    c.fail("insufficient_funds")
    c.step("flag_conflict", conflict_reason="The provider reported this invoice paid, then a payment_failed "
                                            "arrived citing the same payment attempt.")
    made.append(conflict)

    annual = _subscription("annie@example.com", "Annie Annual", "sub_demo_annual", "price_annual_pro", "year",
                           now - timedelta(days=400))
    a = _invoice(annual, "in_demo_annual_2026", 49000, now - timedelta(hours=6))
    a.fail("stolen_card")
    made.append(annual)

    # Collected through Alipay recurring deduction (seed 003): the renewal deduction found too little
    # balance, so the policy's first retry waits six hours.
    alipay = _subscription("li.wei@example.com", "Li Wei", DEMO_ALIPAY_AGREEMENT, "alipay_monthly", "month",
                           now - timedelta(days=35), provider="alipay", account=DEMO_ALIPAY_APP,
                           customer_id="2088000000000001")
    ali = _invoice(alipay, "RN202612010000000001", 3000, now - timedelta(hours=2), currency="cny")
    ali.fail("ACQ.BUYER_BALANCE_NOT_ENOUGH")
    ali.step("schedule_retry")
    made.append(alipay)
    return list(Subscription.objects.filter(pk__in=[s.pk for s in made]).select_related("customer").order_by("pk"))
