"""The admin shows stored provider bodies in their masked form, and "purged on …" once the retention
job emptied them — never the raw PII (Chromium via Playwright; screenshots in var/screenshots/)."""

from __future__ import annotations

import urllib.error
import urllib.request
from datetime import timedelta

import pytest
from django.urls import reverse

from dunning.clock import trusted_now
from dunning.evidence.receipts import receipt_record
from dunning.jobs.framework import job_run
from dunning.models import EventOutcome, ProviderEvent, ProviderReceipt, WebhookDelivery
from tests.console.conftest import PASSWORD
from tests.console.test_browser import admin_login
from tests.privacy.scenes import stored_event
from tests.privacy.test_intake_masked import EMAIL, NAME, PHONE, STREET, charge_with_pii
from tests.support.browser import screenshot
from tests.support.signing import event_body, stripe_signature

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def admin_user(django_user_model, settings):
    settings.STRIPE_WEBHOOK_SECRETS = ["whsec_local"]
    settings.STRIPE_ACCOUNT = "acct_demo"
    settings.RAW_BODY_RETENTION_DAYS = 90
    return django_user_model.objects.create_superuser("privacy-lead", "lead@example.com", PASSWORD)


def deliver(live_server, body: bytes) -> int:
    request = urllib.request.Request(f"{live_server.url}/webhooks/stripe/", data=body, method="POST", headers={
        "Content-Type": "application/json", "Stripe-Signature": stripe_signature(body, "whsec_local")})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status
    except urllib.error.HTTPError as refused:
        return refused.code


def assert_no_pii(text: str) -> None:
    for value in (EMAIL, NAME, PHONE, STREET):
        assert value not in text, f"{value!r} shown in the clear"


def test_the_admin_shows_the_masked_body_and_purged_on(live_server, new_page, admin_user):
    body = event_body("evt_admin_pii", "charge.failed", obj=charge_with_pii())
    assert deliver(live_server, body) == 200
    delivery = WebhookDelivery.objects.get(claimed_event_id="evt_admin_pii")
    event = ProviderEvent.objects.get(event_id="evt_admin_pii")
    receipt = receipt_record(object_type="charge", body=charge_with_pii(), fetched_at=trusted_now())
    now = trusted_now()
    old = stored_event("evt_admin_old", EventOutcome.APPLIED, now - timedelta(days=120), invoice_id="in_admin_old")
    assert job_run("purge_raw_bodies", now=now).changed == 2  # the old event and its delivery

    page = new_page()
    admin_login(page, live_server, admin_user)
    page.goto(f"{live_server.url}{reverse('admin:dunning_webhookdelivery_change', args=[delivery.pk])}")
    shown = page.locator("pre.stored-body").inner_text()
    assert '"receipt_email": "hmac:' in shown and '"last4": "**** 4242"' in shown and "J*** D***" in shown
    assert '"amount": 4900' in shown and '"invoice": "in_pii"' in shown, "what decisions read is shown as is"
    assert_no_pii(page.content())
    screenshot(page, "privacy_delivery_masked")

    for url in (reverse("admin:dunning_providerevent_change", args=[event.pk]),
                reverse("admin:dunning_providerreceipt_change", args=[receipt.pk])):
        page.goto(f"{live_server.url}{url}")
        assert "hmac:" in page.locator("pre.stored-body").inner_text()
        assert_no_pii(page.content())

    page.goto(f"{live_server.url}{reverse('admin:dunning_providerevent_change', args=[old.pk])}")
    purged = page.locator("p.body-purged").inner_text()
    assert f"Purged on {now:%Y-%m-%d}" in purged and "digests, receipts and facts are kept" in purged
    assert '"in_admin_old"' in page.content() and "customer_email" not in page.content()
    screenshot(page, "privacy_event_purged")
    assert ProviderReceipt.objects.get(pk=receipt.pk).body_purged_at is None, "a fresh receipt is not purged"
