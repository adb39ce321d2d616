"""Issue 17 item 7 in Debian's Chromium against the live server: a billing lead opens the
"Needs review" queue, takes ownership of an intent whose upstream answered 503, and resolves it
as delivered (capture). Screenshots land in var/screenshots/agentpay_*.png (git-ignored)."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.urls import reverse

from agentpay.bridge import trusted_now
from agentpay.jobs import agentpay_job_run
from agentpay.models import IntentReceipt, PaymentIntent, Transfer
from tests.support.browser import screenshot

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_lead_takes_ownership_and_resolves_a_review_in_the_browser(live_server, new_page, funded, routes,
                                                                     upstream, call, lead):
    intent = PaymentIntent.objects.get(intent_id=call("boom").json()["intent_id"])
    upstream.status_override[intent.fulfillment.fulfillment_id] = "in_progress"
    with time_machine.travel(trusted_now() + timedelta(minutes=16), tick=False):
        agentpay_job_run("agentpay_recovery_deadline")
    page = new_page()
    page.goto(f"{live_server.url}/admin/login/")
    page.fill("#id_username", lead.username)
    page.fill("#id_password", "x")
    page.click("input[type=submit]")
    page.wait_for_selector("#site-name")

    page.goto(f"{live_server.url}{reverse('admin:agentpay_reviewqueueintent_changelist')}")
    listing = page.locator("#result_list").inner_text()
    assert intent.intent_id in listing and "WALLET_HOLD_NEEDS_REVIEW" in listing and "150 USD" in listing
    screenshot(page, "agentpay_review_queue")

    page.click(f"text={intent.intent_id}")
    assert "Needs review" in page.locator("#ap-review").inner_text()
    assert "fulfillment.upstream_5xx" in page.locator("#ap-timeline").inner_text()
    screenshot(page, "agentpay_review_intent")
    page.click("text=Take ownership…")
    page.fill("#ap-form textarea[name=reason]", "On call for AgentPay reviews this week")
    page.fill("#ap-form input[name=ticket]", "OPS-2001")
    page.click("#ap-submit")
    assert "You own the review" in page.locator("ul.messagelist").inner_text()

    page.click("text=Delivered — capture…")
    page.fill("#ap-form textarea[name=reason]", "Upstream operator confirmed job ran (their log line 8812)")
    page.fill("#ap-form input[name=ticket]", "OPS-2001")
    screenshot(page, "agentpay_review_delivered_form")
    page.click("#ap-submit")
    assert f"Intent {intent.intent_id} is completed (COMPLETED)" in page.locator("ul.messagelist").inner_text()
    timeline = page.locator("#ap-timeline").inner_text()
    assert "intent.manual_resolved_confirmed" in timeline and "Posts a hold (capture)" in timeline
    screenshot(page, "agentpay_review_resolved")

    intent.refresh_from_db()
    assert intent.state == "completed" and intent.review_owner == lead
    assert Transfer.objects.filter(intent=intent, kind="post_pending").count() == 1
    assert IntentReceipt.objects.get(intent=intent, event="manual_resolved_confirmed").ticket == "OPS-2001"
