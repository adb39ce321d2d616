"""Fulfillment after a confirmed on-chain payment (issue 18 item 4): 2xx completed, 4xx refund
required with a RefundObligation paid back on chain by a billing lead, 5xx unknown."""

from __future__ import annotations

import time

import pytest

from agentpay.composite import SETTLED_FULFILLMENT_FAILED_REFUND_REQUIRED, display_status
from agentpay.jobs import agentpay_job_run
from agentpay.models import ChainTransaction, IntentReceipt, RefundObligation
from agentpay.services.acceptance import lines_of
from agentpay.services.onchain_flow import intent_drive_onchain
from agentpay.services.refunds import refund_pay, refund_query, refunds_open
from agentpay.services.results import Cause, Refusal
from tests.agentpay_chain.support import authorized_intent, lines, world
from tests.support.actors import AGENTS, make_user, role

pytestmark = pytest.mark.django_db(transaction=True)
CAUSE = Cause.system("test")


def drive(intent):
    return intent_drive_onchain(intent=intent, cause=CAUSE, access=None, request_id=intent.first_request_id,
                                wait_seconds=5)


def test_upstream_4xx_leaves_a_refund_a_lead_pays_back_on_chain(chain, upstream, lead, settings):
    settings.AGENTPAY_RECOVERY_DEADLINE_SECONDS = 1
    w = world(chain, upstream, path="/bad")
    payer = chain.payers[0]
    before = chain.balance(payer.address)
    intent = authorized_intent(w, payer)
    driven = drive(intent)
    assert driven.answer.status == 422
    assert lines(intent) == ("authorized", "confirmed", "failed")  # C08: the intent waits for the refund
    settlement = intent.settlements.get()
    assert display_status(lines_of(intent, settlement, intent.fulfillment)) == \
        SETTLED_FULFILLMENT_FAILED_REFUND_REQUIRED
    refund = RefundObligation.objects.get(intent=intent)
    assert refund.refund_id.startswith("rfd_") and refund.state == "not_started"
    assert int(refund.amount) == w.amount and refund.payer == payer.address.lower()
    assert [r.refund_id for r in refunds_open()] == [refund.refund_id]
    assert chain.balance(payer.address) == before - w.amount

    with pytest.raises(Refusal) as refused:
        refund_pay(refund.refund_id, user=lead, reason="", ticket="")
    assert refused.value.code == "REASON_AND_TICKET_REQUIRED"
    paid = refund_pay(refund.refund_id, user=lead, reason="upstream refused the call", ticket="OPS-1")
    assert paid.accepted and paid.state == "submitted"
    assert refund_query(refund.refund_id, cause=CAUSE).state == "confirmed"
    assert chain.balance(payer.address) == before  # paid back, once
    with pytest.raises(Refusal):
        refund_pay(refund.refund_id, user=lead, reason="again", ticket="OPS-1")
    assert ChainTransaction.objects.filter(refund=refund).count() == 1

    # At the recovery deadline (1 s here) the intent goes to review, and the paid refund closes
    # it as not delivered, by the lead who paid it (C08).
    time.sleep(1.1)
    run = agentpay_job_run("agentpay_onchain_reconcile")
    assert run.errors == 0, run.notes
    assert lines(intent) == ("failed", "confirmed", "failed")
    closing = IntentReceipt.objects.filter(intent=intent, event="manual_resolved_failed").get()
    assert closing.actor_user == lead and closing.ticket == "OPS-1"
    assert list(IntentReceipt.objects.filter(intent=intent, line="refund").values_list("event", flat=True)) == [
        "owner_assigned", "submit_ok", "seen_on_chain", "confirmations_reached"]


def test_refund_needs_a_billing_lead(chain, upstream):
    w = world(chain, upstream, path="/bad")
    intent = authorized_intent(w, chain.payers[0])
    drive(intent)
    nobody = make_user("nobody", staff=True)
    with pytest.raises(Refusal) as refused:
        refund_pay(RefundObligation.objects.get(intent=intent).refund_id, user=nobody, reason="r", ticket="t")
    assert refused.value.code == "NOT_PERMITTED"


def test_upstream_5xx_after_payment_is_unknown_never_called_again(chain, upstream):
    w = world(chain, upstream, path="/boom")
    intent = authorized_intent(w, chain.payers[0])
    driven = drive(intent)
    assert driven.answer.outcome == "5xx"
    assert lines(intent) == ("authorized", "confirmed", "unknown")
    drive(intent)  # a replay only reads
    assert len(upstream.calls) == 1
    assert not RefundObligation.objects.filter(intent=intent).exists()


def test_the_admin_pay_page_pays_once_with_a_reason_and_a_ticket(chain, upstream, lead, client):
    w = world(chain, upstream, path="/bad")
    payer = chain.payers[0]
    before = chain.balance(payer.address)
    intent = authorized_intent(w, payer)
    drive(intent)
    refund = RefundObligation.objects.get(intent=intent)
    client.force_login(lead)
    url = f"/admin/agentpay/refundobligation/{refund.pk}/pay/"
    assert client.get(url).status_code == 200
    refused = client.post(url, {"reason": "", "ticket": ""})
    assert refused.status_code == 200 and RefundObligation.objects.get(pk=refund.pk).state == "not_started"
    paid = client.post(url, {"reason": "upstream refused the call", "ticket": "OPS-9"})
    assert paid.status_code == 302
    refund.refresh_from_db()
    assert refund.state == "submitted" and refund.owner == lead and refund.ticket == "OPS-9"
    again = client.post(url, {"reason": "twice?", "ticket": "OPS-9"})
    assert again.status_code == 200 and b"ALREADY_PAID" in again.content
    refund_query(refund.refund_id, cause=CAUSE)
    assert chain.balance(payer.address) == before
    client.force_login(make_user("agent", staff=True))
    assert client.post(url, {"reason": "r", "ticket": "t"}).status_code == 403


def test_the_admin_shows_the_chain_evidence_and_offers_the_refund_to_a_lead_only(chain, upstream, lead, client):
    w = world(chain, upstream, path="/bad")
    intent = authorized_intent(w, chain.payers[0])
    drive(intent)
    refund = RefundObligation.objects.get(intent=intent)
    tx = ChainTransaction.objects.get(settlement__intent=intent)
    client.force_login(lead)
    page = client.get(f"/admin/agentpay/paymentintent/{intent.pk}/change/").content.decode()
    for seen in ("402 challenge", "authorization signed by the payer", tx.tx_hash, f"refund owed {refund.refund_id}"):
        assert seen in page, seen
    refund_page = client.get(f"/admin/agentpay/refundobligation/{refund.pk}/change/").content.decode()
    assert 'id="ap-pay-refund"' in refund_page
    for listing in ("chaintransaction", "chainauthorization", "paymentchallenge", "chainnetwork",
                    "refundobligation"):
        assert client.get(f"/admin/agentpay/{listing}/").status_code == 200, listing
    agent = make_user("agent", staff=True)
    agent.groups.add(role(AGENTS, app_label="agentpay", codenames=["view_refundobligation", "view_paymentintent"]))
    client.force_login(agent)
    assert 'id="ap-pay-refund"' not in client.get(f"/admin/agentpay/refundobligation/{refund.pk}/change/"
                                                  ).content.decode()
