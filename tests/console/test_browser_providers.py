"""Issue 20 in Chromium: the console's page and the customer's page of an Alipay subscription
(screenshots var/screenshots/admin_subscription_alipay.png, customer_billing_alipay.png)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.console.conftest import ALIPAY_AGREEMENT, ALIPAY_APP_ID
from tests.console.test_browser import admin_login, customer_login
from tests.support.browser import screenshot

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_alipay_subscription_in_the_console_and_on_the_customer_page(
        live_server, new_page, agent, alipay_customer, alipay_scene):
    staff = new_page()
    admin_login(staff, live_server, agent)
    staff.goto(f"{live_server.url}{reverse('admin:subscriptions_subscription_change', args=[alipay_scene.sub.pk])}")
    provider = staff.locator("#provider").inner_text()
    assert "Alipay" in provider and ALIPAY_APP_ID in provider and ALIPAY_AGREEMENT in provider
    assert staff.locator("#provider-dashboard").count() == 0 and staff.locator(".provider-invoice-link").count() == 0
    assert "Deduction order 20260601000000000042" in staff.locator("#blocking-cycles").inner_text()
    screenshot(staff, "admin_subscription_alipay")

    customer = new_page(mobile=True)
    customer_login(customer, live_server, alipay_customer)
    customer.wait_for_selector("#paid-through")
    assert customer.locator("#paid-through").inner_text() == (
        "Paid through Alipay (recurring deduction agreement \u20261234)")
    notice = customer.locator("#invoice-1-notice").inner_text()
    assert "sign the deduction agreement again in Alipay" in notice and "card" not in notice
    assert "¥29.00" in customer.locator("#invoice-1").inner_text()
    screenshot(customer, "customer_billing_alipay")
