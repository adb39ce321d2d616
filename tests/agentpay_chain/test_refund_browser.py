"""Issue 18 in Debian's Chromium against the live server: a billing lead finds a paid call the
upstream refused (4xx), reads its on-chain timeline, and pays the refund back on chain from the
refund's page. Screenshots land in var/screenshots/agentpay_chain_*.png (git-ignored)."""

from __future__ import annotations

import pytest

from agentpay.models import RefundObligation
from agentpay.services.onchain_flow import intent_drive_onchain
from agentpay.services.results import Cause
from tests.agentpay_chain.support import authorized_intent, world
from tests.support.browser import screenshot

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_lead_reads_the_chain_timeline_and_pays_a_refund_back(live_server, new_page, chain, upstream, lead):
    w = world(chain, upstream, path="/bad")
    payer = chain.payers[0]
    intent = authorized_intent(w, payer)
    intent_drive_onchain(intent=intent, cause=Cause.system("test"), access=None,
                         request_id=intent.first_request_id, wait_seconds=5)
    refund = RefundObligation.objects.get(intent=intent)
    page = new_page()
    page.goto(f"{live_server.url}/admin/login/")
    page.fill("#id_username", lead.username)
    page.fill("#id_password", "x")
    page.click("input[type=submit]")
    page.wait_for_selector("#site-name")

    page.goto(f"{live_server.url}/admin/agentpay/paymentintent/{intent.pk}/change/")
    timeline = page.locator("#ap-timeline").inner_text()
    assert "402 challenge" in timeline and "settlement transaction" in timeline and refund.refund_id in timeline
    screenshot(page, "agentpay_chain_intent_timeline")

    page.goto(f"{live_server.url}/admin/agentpay/refundobligation/{refund.pk}/change/")
    screenshot(page, "agentpay_chain_refund")
    page.click("#ap-pay-refund")
    page.fill("#ap-form textarea[name=reason]", "Upstream refused the call (400); paid on chain")
    page.fill("#ap-form input[name=ticket]", "OPS-3001")
    screenshot(page, "agentpay_chain_refund_form")
    page.click("#ap-submit")
    assert f"Refund {refund.refund_id} is submitted" in page.locator("ul.messagelist").inner_text()  # not "Rfd_…"
    screenshot(page, "agentpay_chain_refund_paid")
    refund.refresh_from_db()
    assert refund.state == "submitted" and refund.ticket == "OPS-3001"
