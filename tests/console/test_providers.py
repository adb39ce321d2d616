"""Issue 20: every console surface and the customer page show the provider of the subscription,
with Stripe-only links only for Stripe and Alipay's agreement and order numbers shown plainly."""

from __future__ import annotations

import json
import re

from django.urls import reverse

from dunning.clock import trusted_now
from dunning.models import ProviderEvent, WebhookDelivery
from dunning.policy.publishing import policy_publish
from tests.console.conftest import ALIPAY_AGREEMENT, ALIPAY_APP_ID
from tests.support.builders import make_subscription, policy_document


def page_url(sub) -> str:
    return reverse("admin:subscriptions_subscription_change", args=[sub.pk])


def visible(html: str) -> str:
    html = re.sub(r"<(style|script)\b.*?</\1>", " ", html, flags=re.S)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def test_the_alipay_subscription_page_shows_agreement_app_id_and_order_plainly(client, agent, alipay_scene):
    client.force_login(agent)
    html = client.get(page_url(alipay_scene.sub)).content.decode()
    text = visible(html)
    assert "Provider Alipay , app_id 2021000000000001" in text
    assert f"Recurring deduction agreement {ALIPAY_AGREEMENT}" in text
    assert "Deduction order 20260601000000000042" in text
    assert "dashboard.stripe.com" not in html and "View in" not in html and "view in" not in html
    assert "alipay-monthly@1" in text


def test_the_stripe_subscription_page_links_to_the_stripe_dashboard(client, agent, grace_scene):
    client.force_login(agent)
    html = client.get(page_url(grace_scene.sub)).content.decode()
    sub_id, invoice_id = grace_scene.sub.provider_subscription_id, grace_scene.cycle.invoice.provider_invoice_id
    assert "Provider Stripe , account acct_test" in visible(html)
    assert f'href="https://dashboard.stripe.com/subscriptions/{sub_id}"' in html
    assert f'href="https://dashboard.stripe.com/invoices/{invoice_id}"' in html
    assert "View in Stripe dashboard" in html


def test_lists_show_and_filter_by_provider(client, agent, grace_scene, alipay_scene):
    client.force_login(agent)
    subs = reverse("admin:subscriptions_subscription_changelist")
    page = visible(client.get(subs).content.decode())
    assert f"Alipay · {ALIPAY_APP_ID}" in page and "Stripe · acct_test" in page
    only_alipay = client.get(subs, {"provider": "alipay"}).content.decode()
    assert ALIPAY_AGREEMENT in only_alipay and grace_scene.sub.provider_subscription_id not in only_alipay
    only_stripe = client.get(subs, {"provider": "stripe"}).content.decode()
    assert ALIPAY_AGREEMENT not in only_stripe and grace_scene.sub.provider_subscription_id in only_stripe

    invoices = reverse("admin:subscriptions_invoice_changelist")
    text = visible(client.get(invoices, {"provider": "alipay"}).content.decode())
    assert "20260601000000000042" in text and "deduction order" in text
    assert grace_scene.cycle.invoice.provider_invoice_id not in text
    cycles = visible(client.get(reverse("admin:dunning_dunningcycle_changelist"), {"provider": "alipay"})
                     .content.decode())
    assert f"Alipay · {ALIPAY_APP_ID}" in cycles and "Stripe · acct_test" not in cycles


def test_events_and_deliveries_filter_by_provider(client, lead, db):
    now = trusted_now()
    ProviderEvent.objects.create(provider="alipay", event_id="2026060100222000000000000001",
                                 event_type="TRADE_CLOSED", payload={}, received_at=now)
    ProviderEvent.objects.create(provider="stripe", event_id="evt_stripe_1", event_type="invoice.paid", payload={},
                                 received_at=now)
    for provider, claimed in (("alipay", "notify_alipay_1"), ("stripe", "evt_delivery_1")):
        WebhookDelivery.objects.create(provider=provider, received_at=now, body_sha256="0" * 64, body_size=0,
                                       verification="VERIFIED", claimed_event_id=claimed)
    client.force_login(lead)
    events = reverse("admin:dunning_providerevent_changelist")
    page = client.get(events, {"provider": "alipay"}).content.decode()
    assert "2026060100222000000000000001" in page and "evt_stripe_1" not in page
    assert "Alipay" in visible(page)
    deliveries = reverse("admin:dunning_webhookdelivery_changelist")
    page = client.get(deliveries, {"provider": "alipay"}).content.decode()
    assert "notify_alipay_1" in page and "evt_delivery_1" not in page
    assert client.get(deliveries, {"provider": "paypal"}).status_code == 200  # nothing matches; no error


def test_the_alipay_customer_page_asks_to_sign_the_agreement_again(client, alipay_customer, alipay_scene):
    client.force_login(alipay_customer)
    html = client.get(reverse("billing-subscription", args=[alipay_scene.sub.pk])).content.decode()
    text = visible(html)
    assert "Paid through Alipay (recurring deduction agreement \u20261234)" in text
    assert "sign the deduction agreement again in Alipay" in text
    assert "¥29.00" in text
    assert "card" not in text.lower()
    assert "Stripe" not in text


def test_the_stripe_customer_page_says_paid_through_stripe(client, customer_a, grace_scene):
    client.force_login(customer_a)
    text = visible(client.get(reverse("billing-subscription", args=[grace_scene.sub.pk])).content.decode())
    assert "Paid through Stripe" in text and "Alipay" not in text


def test_an_unknown_provider_is_shown_as_it_is(client, agent, policy):
    policy_publish(text=json.dumps(policy_document(policy="paddle-default@1", default=True,
                                                   provider={"name": "paddle", "account": "vnd_1"})))
    sub = make_subscription(provider="paddle", provider_account="vnd_1", provider_subscription_id="ctr_1")
    client.force_login(agent)
    text = visible(client.get(page_url(sub)).content.decode())
    assert "Provider paddle , account vnd_1" in text  # a provider with no label yet: its name as it is
