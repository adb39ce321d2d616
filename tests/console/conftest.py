"""Actors and scenes of the support console and the customer billing pages.

Named actors: `agent` (Support agents), `lead` (Billing leads), `customer_a` / `customer_b`
(billing logins). Scenes are built only through the acceptance service (tests/support/builders.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from dunning.models import DunningCycle
from subscriptions.models import Subscription
from subscriptions.providers.base import ProviderInvoice
from tests.support.actors import AGENTS, LEADS, customer_login, make_staff, staff_roles_from_migration
from tests.support.builders import accept, fail_first_payment, make_subscription, open_cycle, reload

# Live-server tests drive the browser from the test's thread while Django's ORM runs sync code there.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

PASSWORD = "correct horse battery staple"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "var" / "screenshots"


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
        from subscriptions.models import Invoice

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


def ensure_chromium() -> str:
    """Debian's chromium; installed with apt-get when missing (the test machine runs as root)."""
    if not Path(CHROMIUM).exists():
        if shutil.which("apt-get") is None or os.geteuid() != 0:
            raise RuntimeError(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium)")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], check=True, env=env)
    return CHROMIUM


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    executable = ensure_chromium()
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, headless=True)
        yield chromium
        chromium.close()


@pytest.fixture
def new_page(browser):
    """`new_page(mobile=False)`: a page in its own context (own cookies), closed after the test."""
    contexts = []

    def make(*, mobile: bool = False):
        options = {"viewport": {"width": 390, "height": 844}, "is_mobile": True} if mobile else \
            {"viewport": {"width": 1400, "height": 1000}}
        context = browser.new_context(**options)
        context.set_default_timeout(15_000)
        contexts.append(context)
        return context.new_page()

    yield make
    for context in contexts:
        context.close()


def screenshot(page: Any, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)
