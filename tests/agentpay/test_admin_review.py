"""The admin's "Needs review" queue and its actions: who sees what, who may act (agent, lead,
outsider), and that each action goes through the service with a reason and a ticket."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.urls import reverse

from agentpay.bridge import trusted_now
from agentpay.jobs import agentpay_job_run
from agentpay.models import IntentReceipt, LedgerAccount, PaymentIntent, Transfer
from tests.support.actors import AGENTS, make_user, role

pytestmark = pytest.mark.django_db


def in_review(call, upstream) -> PaymentIntent:
    response = call("boom")
    intent = PaymentIntent.objects.get(intent_id=response.json()["intent_id"])
    upstream.status_override[intent.fulfillment.fulfillment_id] = "in_progress"
    with time_machine.travel(trusted_now() + timedelta(minutes=16), tick=False):
        agentpay_job_run("agentpay_recovery_deadline")
    intent.refresh_from_db()
    assert intent.state == "needs_review"
    return intent


@pytest.fixture
def agent(db):
    user = make_user("agent", staff=True)
    user.groups.add(role(AGENTS, app_label="agentpay", codenames=[
        "view_paymentintent", "view_reviewqueueintent", "view_tenant", "view_ledgeraccount"]))
    return user


@pytest.fixture
def outsider(db, django_user_model):
    return django_user_model.objects.create_user("outsider", password="x")


def review_url(intent: PaymentIntent, key: str) -> str:
    return reverse("admin:agentpay_reviewqueueintent_review", args=[intent.pk, key])


def test_the_queue_lists_owner_age_rail_amount_and_status(funded, routes, upstream, call, lead, client):
    intent = in_review(call, upstream)
    call("ok", key="k-done")  # a completed intent is not in the queue
    client.force_login(lead)
    page = client.get(reverse("admin:agentpay_reviewqueueintent_changelist"))
    assert page.status_code == 200
    text = page.content.decode()
    assert intent.intent_id in text and "WALLET_HOLD_NEEDS_REVIEW" in text and "lead" in text and "150 USD" in text
    assert text.count("pi_") == 1
    everything = client.get(reverse("admin:agentpay_paymentintent_changelist")).content.decode()
    assert everything.count("pi_") == 2


def test_the_intent_page_shows_the_timeline(funded, routes, upstream, call, lead, client):
    intent = in_review(call, upstream)
    client.force_login(lead)
    page = client.get(reverse("admin:agentpay_reviewqueueintent_change", args=[intent.pk])).content.decode()
    for seen in ("fulfillment.upstream_5xx", "settlement.hold_acquired", "Pending (a hold)", "request_id",
                 "agentpay.intent.changed", "intent.recovery_deadline_exceeded", "Take ownership"):
        assert seen in page, seen


def test_a_lead_takes_ownership_and_resolves_delivered(funded, routes, upstream, call, lead, client):
    intent = in_review(call, upstream)
    client.force_login(lead)
    refused = client.post(review_url(intent, "delivered"), {"reason": "upstream log shows it", "ticket": ""})
    assert refused.status_code == 200 and "This field is required" in refused.content.decode()
    taken = client.post(review_url(intent, "take_ownership"), {"reason": "on call", "ticket": "OPS-9"})
    assert taken.status_code == 302
    done = client.post(review_url(intent, "delivered"), {"reason": "upstream log shows it", "ticket": "OPS-9"})
    assert done.status_code == 302
    intent.refresh_from_db()
    assert intent.state == "completed" and intent.review_owner == lead
    assert Transfer.objects.filter(intent=intent, kind="post_pending").count() == 1
    receipt = IntentReceipt.objects.get(intent=intent, event="manual_resolved_confirmed")
    assert (receipt.actor, receipt.reason, receipt.ticket) == ("user:lead", "upstream log shows it", "OPS-9")


def test_a_lead_resolves_not_delivered(funded, routes, upstream, call, lead, client):
    intent = in_review(call, upstream)
    client.force_login(lead)
    assert client.post(review_url(intent, "not_delivered"), {"reason": "never arrived", "ticket": "OPS-10"}
                       ).status_code == 302
    intent.refresh_from_db()
    assert intent.state == "failed"
    assert LedgerAccount.objects.get(kind="wallet", tenant=funded).available == 1000


def test_an_agent_sees_the_queue_but_cannot_act(funded, routes, upstream, call, agent, client):
    intent = in_review(call, upstream)
    client.force_login(agent)
    assert client.get(reverse("admin:agentpay_reviewqueueintent_changelist")).status_code == 200
    page = client.get(reverse("admin:agentpay_reviewqueueintent_change", args=[intent.pk])).content.decode()
    assert "Take ownership" not in page and "Only billing leads" in page
    for key in ("take_ownership", "delivered", "not_delivered"):
        assert client.post(review_url(intent, key), {"reason": "r", "ticket": "t"}).status_code == 403
    intent.refresh_from_db()
    assert intent.state == "needs_review" and intent.review_owner.username == "lead"
    assert client.get(reverse("admin:agentpay_transfer_changelist")).status_code == 403


def test_an_outsider_gets_the_login_page(funded, routes, upstream, call, outsider, client):
    intent = in_review(call, upstream)
    client.force_login(outsider)
    for url in (reverse("admin:agentpay_reviewqueueintent_changelist"), review_url(intent, "delivered")):
        response = client.post(url, {"reason": "r", "ticket": "t"})
        assert response.status_code == 302 and "/login/" in response["Location"]
    intent.refresh_from_db()
    assert intent.state == "needs_review"


def test_nothing_is_editable_in_the_admin(funded, routes, upstream, call, lead, client):
    intent = in_review(call, upstream)
    client.force_login(lead)
    response = client.post(reverse("admin:agentpay_paymentintent_change", args=[intent.pk]), {"state": "completed"})
    assert response.status_code == 403
    intent.refresh_from_db()
    assert intent.state == "needs_review"
    assert client.get(reverse("admin:agentpay_paymentintent_add")).status_code == 403


def test_a_lead_credits_a_wallet_with_a_reason_and_a_ticket(funded, lead, agent, client):
    wallet = LedgerAccount.objects.get(kind="wallet", tenant=funded)
    url = reverse("admin:agentpay_ledgeraccount_credit", args=[wallet.pk])
    client.force_login(agent)
    assert client.post(url, {"amount": 500, "reason": "goodwill", "ticket": "SUP-1"}).status_code == 403
    client.force_login(lead)
    page = client.get(reverse("admin:agentpay_ledgeraccount_change", args=[wallet.pk]))
    assert "Staff credit" in page.content.decode()
    assert client.post(url, {"amount": -5, "reason": "goodwill", "ticket": "SUP-1"}).status_code == 200
    assert client.post(url, {"amount": 500, "reason": "goodwill", "ticket": "SUP-1"}).status_code == 302
    wallet.refresh_from_db()
    assert wallet.available == 1500
    credit = Transfer.objects.filter(credit_account=wallet).latest("pk")
    assert (credit.amount, credit.reason, credit.ticket, credit.actor) == (500, "goodwill", "SUP-1", "user:lead")
