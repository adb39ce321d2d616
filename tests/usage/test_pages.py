"""Usage on the support console's subscription page and on the customer's billing page, in Debian's
Chromium (Playwright, live server), and the customer's own CSV download in a REVOKED profile.
Screenshots: var/screenshots/usage_admin_subscription.png, usage_customer_billing.png."""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from pathlib import Path

import pytest
from django.test import Client
from django.urls import reverse

from dunning.clock import trusted_now
from entitlements.api.tokens import service_token_create
from subscriptions.models import Subscription
from subscriptions.usage import usage_mark_invoiced, usage_record
from tests.console.test_browser import admin_login, customer_login
from tests.support.actors import AGENTS, make_staff, staff_roles_from_migration
from tests.support.actors import customer_login as link_login
from tests.support.browser import screenshot
from tests.support.builders import fail_first_payment, make_policy, make_subscription, open_cycle
from tests.usage.conftest import subscription_in_profile, usage

PASSWORD = "correct horse battery staple"
pytestmark = pytest.mark.django_db(transaction=True)


def _with_usage(sub: Subscription) -> Subscription:
    meter, _ = service_token_create(name=f"meter-{sub.pk}", scopes=("usage:write",))
    at = trusted_now() - timedelta(minutes=30)
    tokens = [usage_record(subscription=sub, producer=meter, usage=usage(f"tok-{n}", quantity=q, cost=c,
                                                                         occurred_at=at + timedelta(minutes=n)))
              for n, (q, c) in enumerate([(120_000, 360), (80_000, 240)])]
    usage_record(subscription=sub, producer=meter, usage=usage("call-1", metric="calls", quantity=42, cost=84,
                                                                occurred_at=at))
    usage_mark_invoiced(record_pks=[tokens[0].record.pk], provider_invoice_id="in_usage_nov")
    return sub


@pytest.fixture
def grace_with_usage():
    staff_roles_from_migration()
    make_policy()
    sub = make_subscription(email="ada@example.com")
    fail_first_payment(open_cycle(sub, amount=4900))
    return _with_usage(Subscription.objects.get(pk=sub.pk))


def test_the_admin_shows_usage_totals_invoiced_and_not_beside_the_debt(live_server, new_page, grace_with_usage):
    sub = grace_with_usage
    agent = make_staff("agent", AGENTS, password=PASSWORD)
    page = new_page()
    admin_login(page, live_server, agent)
    page.goto(f"{live_server.url}{reverse('admin:subscriptions_subscription_change', args=[sub.pk])}")
    assert "GRACE_ACTIVE" in page.locator("#blocking-cycles").inner_text()
    heading = page.locator("#usage-heading").inner_text()
    assert "3 records" in heading and "kept apart from the debt" in heading
    rows = {r.split("\t")[0]: r.split("\t") for r in page.locator("#usage-totals tbody tr").all_inner_texts()}
    assert rows["Tokens"][1:] == ["2", "200,000", "$6.00", "80,000 · $2.40", "120,000 · $3.60"]
    assert rows["Calls"][1:] == ["1", "42", "$0.84", "42 · $0.84", "0 · $0.00"]
    assert page.locator("#usage-uninvoiced-cost").inner_text() == "$3.24"
    assert "Tokens" in page.locator("#usage-period").inner_text()
    page.click("#usage-recent-details summary")
    recent = page.locator("#usage-recent").inner_text()
    assert "in_usage_nov" in recent and "not yet invoiced" in recent and "call-1" in recent
    screenshot(page, "usage_admin_subscription")
    with page.expect_download() as download:  # the console's export is the API's, with the staff session
        page.click("#usage-export-csv")
    exported = list(csv.DictReader(io.StringIO(Path(download.value.path()).read_text())))
    assert {r["provider_invoice_id"] for r in exported} == {"in_usage_nov", ""} and len(exported) == 3
    page.click("#usage-all")
    page.wait_for_selector("#result_list")
    assert page.locator("#result_list tbody tr").count() == 3
    assert page.locator("#changelist").locator("a.addlink").count() == 0  # view only: no add button


def test_the_customer_reads_usage_this_period_and_that_it_is_kept(live_server, new_page, grace_with_usage):
    sub = grace_with_usage
    user = link_login(sub, "ada", password=PASSWORD)
    page = new_page(mobile=True)
    customer_login(page, live_server, user)
    page.wait_for_selector("#usage-card")
    card = page.locator("#usage-card").inner_text()
    assert "Usage this period" in card
    assert "200,000 tokens" in card and "$6.00" in card and "42 calls" in card and "$0.84" in card
    assert page.locator("#usage-total").inner_text() == "$6.84"
    assert "Not yet on an invoice: $3.24" in page.locator("#usage-not-invoiced").inner_text()
    assert "never deletes usage already recorded" in card
    assert "kept apart from the open invoice above" in card  # the renewal failed: an invoice is open
    screenshot(page, "usage_customer_billing")
    with page.expect_download() as download:
        page.click("#usage-download")
    rows = list(csv.DictReader(io.StringIO(Path(download.value.path()).read_text())))
    assert sorted(r["producer_record_id"] for r in rows) == ["call-1", "tok-0", "tok-1"]


def test_a_revoked_customer_still_sees_and_downloads_their_usage():
    staff_roles_from_migration()
    sub = _with_usage(subscription_in_profile("REVOKED"))
    user = link_login(sub, "revoked-customer", password=PASSWORD)
    client = Client()
    client.force_login(user)
    page = client.get(reverse("billing-subscription", args=[sub.pk]))
    assert page.status_code == 200 and b"Usage this period" in page.content and b"$6.84" in page.content
    download = client.get(reverse("billing-usage-export", args=[sub.pk]))
    assert download.status_code == 200 and download["Content-Type"].startswith("text/csv")
    assert len(list(csv.DictReader(io.StringIO(b"".join(download.streaming_content).decode())))) == 3
    make_policy()
    stranger = Client()
    stranger.force_login(link_login(make_subscription(), "stranger", password=PASSWORD))
    assert stranger.get(reverse("billing-usage-export", args=[sub.pk])).status_code == 404
