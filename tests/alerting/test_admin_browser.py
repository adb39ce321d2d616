"""The alert's case page in Debian's Chromium shows who was told: the on-call email and the
webhook, each try with its answer (issue 19 item 2). Screenshot: var/screenshots/alert_deliveries.png."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from django.urls import reverse

from dunning.actions.alerts import alert_raise
from dunning.jobs.framework import job_run
from dunning.models import AlertDelivery, AlertKind
from tests.support.actors import LEADS, make_staff, staff_roles_from_migration
from tests.support.browser import screenshot

pytestmark = pytest.mark.django_db(transaction=True)
PASSWORD = "correct horse battery staple"


def test_a_lead_sees_the_email_and_the_retried_webhook_on_the_alert_page(live_server, new_page, alert_channels,
                                                                         settings):
    staff_roles_from_migration()
    lead = make_staff("lead", LEADS, password=PASSWORD, email="lead@example.com")
    settings.ALERT_DELIVERY_BACKOFF_BASE_SECONDS = 1
    alert_channels.answers = [503, 200]
    alert = alert_raise(kind=AlertKind.DUPLICATE_CHARGE, dedupe_key="duplicate_charge:in_browser",
                        detail="Invoice in_browser was charged twice (pi_1, pi_2)",
                        figures={"payment_refs": ["pi_1", "pi_2"]}, now=datetime.now(UTC))
    time.sleep(1.2)  # past the one-second back-off
    job_run("alert_deliveries")
    assert AlertDelivery.objects.get(alert=alert, channel="WEBHOOK").status == "SENT"

    page = new_page()
    page.goto(f"{live_server.url}/admin/login/")
    page.fill("#id_username", lead.username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#site-name")
    page.goto(f"{live_server.url}{reverse('admin:dunning_alert_change', args=[alert.pk])}")

    email_row = page.locator("#delivery-email").inner_text()
    assert "Email to the on-call list" in email_row and "oncall@example.com" in email_row and "Sent" in email_row
    webhook_row = page.locator("#delivery-webhook").inner_text()
    assert "Signed webhook" in webhook_row and "Sent" in webhook_row and "127.0.0.1" in webhook_row
    assert "secretpath" not in page.content()  # the webhook URL's secret path is never shown
    table = page.locator("#alert-deliveries").inner_text()
    assert "try 1" in table and "HTTP 503" in table and "try 2" in table and "SENT" in table
    screenshot(page, "alert_deliveries")
