"""Actors and scenes of the support console and the customer billing pages.

Named actors: `agent` (Support agents), `lead` (Billing leads), `customer_a` / `customer_b`
(billing logins). Scenes are built only through the acceptance service (tests/support/builders.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from dunning.models import DunningCycle
from dunning.policy.publishing import policy_publish
from subscriptions.models import Invoice, Subscription
from subscriptions.providers.base import ProviderInvoice
from tests.support.actors import AGENTS, LEADS, customer_login, make_staff, staff_roles_from_migration
from tests.support.builders import accept, fail_first_payment, make_subscription, open_cycle, reload

PASSWORD = "correct horse battery staple"


@pytest.fixture
def roles(db):
    staff_roles_from_migration()


def _staff(username: str, group: str) -> Any:
    return make_staff(username, group, password=PASSWORD, email=f"{username}@example.com")


@pytest.fixture
def agent(roles):
    return _staff("agent", AGENTS)


@pytest.fixture
def lead(roles):
    return _staff("lead", LEADS)


@dataclass
class Scene:
    sub: Subscription
    cycle: DunningCycle


@pytest.fixture
def grace_scene(policy) -> Scene:
    """A monthly subscription whose renewal failed: grace, read and export only."""
    sub = make_subscription(email="ada@example.com")
    cycle = open_cycle(sub, amount=4900)
    fail_first_payment(cycle)
    return Scene(Subscription.objects.get(pk=sub.pk), reload(cycle))


@pytest.fixture
def conflict_scene(policy) -> Scene:
    sub = make_subscription(email="connor@example.com")
    cycle = open_cycle(sub, amount=4900)
    fail_first_payment(cycle)
    assert accept(cycle, "flag_conflict", conflict_reason="paid receipt, then a failure for the same attempt")
    return Scene(Subscription.objects.get(pk=sub.pk), reload(cycle))


@pytest.fixture
def customer_a(grace_scene):
    return customer_login(grace_scene.sub, "customer-a", password=PASSWORD)


@pytest.fixture
def customer_b(conflict_scene):
    return customer_login(conflict_scene.sub, "customer-b", password=PASSWORD)


class FakeProvider:
    """Answers fresh invoice fetches with a fixed status (the console's fresh fetch)."""

    name = "stripe"

    def __init__(self, status: str) -> None:
        self.status = status
        self.fetches = 0

    def fetch_invoice(self, invoice_id: str) -> ProviderInvoice:
        self.fetches += 1
        inv = Invoice.objects.get(provider_invoice_id=invoice_id)
        paid = inv.amount_due if self.status == "paid" else 0
        raw = {"id": invoice_id, "object": "invoice", "status": self.status, "amount_due": inv.amount_due,
               "amount_paid": paid, "currency": inv.currency}
        return ProviderInvoice(id=invoice_id, account="acct_test", subscription_id=None, customer_id=None,
                               status=self.status, amount_due=inv.amount_due, amount_paid=paid,
                               currency=inv.currency, attempt_count=max(inv.attempt_count, 1),
                               next_payment_attempt=None, payment_refs=(), price_ids=(), raw=raw)


@pytest.fixture
def provider_says(monkeypatch):
    """`provider_says("paid")`: fresh fetches of any invoice show that status."""

    def install(status: str) -> FakeProvider:
        fake = FakeProvider(status)
        monkeypatch.setattr("dunning.evidence.fresh_fetch.get_provider", lambda name="stripe": fake)
        return fake

    return install


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


ALIPAY_APP_ID = "2021000000000001"
ALIPAY_AGREEMENT = "20215603000000001234"


@pytest.fixture
def alipay_scene(db) -> Scene:
    """An Alipay recurring-deduction subscription (the shipped alipay-monthly policy) whose renewal
    deduction failed because the customer's deduction agreement is no longer active."""
    policy_publish(text=Path("dunning/policy/shipped/alipay-monthly.yaml").read_text())
    sub = make_subscription(email="li.wei@example.com", price="alipay_monthly", provider="alipay",
                            provider_account=ALIPAY_APP_ID, provider_subscription_id=ALIPAY_AGREEMENT)
    cycle = open_cycle(sub, amount=2900, currency="cny", provider_invoice_id="20260601000000000042")
    fail_first_payment(cycle, decline_code="ACQ.AGREEMENT_STATUS_NOT_NORMAL")
    return Scene(Subscription.objects.get(pk=sub.pk), reload(cycle))


@pytest.fixture
def alipay_customer(alipay_scene):
    return customer_login(alipay_scene.sub, "customer-alipay", password=PASSWORD)
