"""Query counts do not grow with rows (SPEC §11, issue item 4): 1,000 subscriptions, each with an
invoice and a cycle, bulk-created; every changelist and the subscription page stay under a fixed
number of queries."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib import admin
from django.urls import reverse

from dunning.acceptance.aggregate import EMPTY_ROOT
from dunning.clock import trusted_now
from dunning.models import DunningCycle
from subscriptions.models import Customer, Invoice, Subscription
from tests.support.builders import fail_first_payment, make_subscription, open_cycle

ROWS = 1000
STATES = ["CURRENT", "GRACE_ACTIVE", "RESTRICTED", "EVIDENCE_CONFLICT", "RECOVERED"]


@pytest.fixture
def thousand(policy, lead):
    now = trusted_now()
    customers = Customer.objects.bulk_create(
        Customer(email=f"bulk{i}@example.com", provider_customer_id=f"cus_bulk{i}") for i in range(ROWS))
    subs = Subscription.objects.bulk_create(
        Subscription(customer=c, provider_account="acct_test", provider_subscription_id=f"sub_bulk{i}",
                     price_id="price_test", policy=policy, outstanding_cycle_root=EMPTY_ROOT)
        for i, c in enumerate(customers))
    invoices = Invoice.objects.bulk_create(
        Invoice(provider_invoice_id=f"in_bulk{i}", subscription=s, amount_due=2500, currency="usd")
        for i, s in enumerate(subs))
    DunningCycle.objects.bulk_create(
        DunningCycle(subscription=s, invoice=inv, amount=2500, currency="usd", policy=policy,
                     state=STATES[i % len(STATES)], opened_at=now - timedelta(days=i % 40),
                     unknown_owner=lead if i % 7 == 0 else None)
        for i, (s, inv) in enumerate(zip(subs, invoices, strict=True)))
    # One subscription with a real history: receipts, snapshots, timeline rows.
    sub = make_subscription()
    for _ in range(3):
        fail_first_payment(open_cycle(sub))
    return sub


def test_every_changelist_and_the_subscription_page_have_bounded_queries(
        client, lead, thousand, django_assert_max_num_queries):
    client.force_login(lead)
    for model, model_admin in admin.site._registry.items():
        opts = model._meta
        if not model_admin.has_view_permission(type("R", (), {"user": lead})()):
            continue
        url = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
        with django_assert_max_num_queries(14):
            response = client.get(url)
        assert response.status_code == 200, opts.label
    sub_list = reverse("admin:subscriptions_subscription_changelist")
    for params in ({"cycle_state": "GRACE_ACTIVE"}, {"owner": "mine"}, {"age": "month"}, {"q": "bulk7@example.com"}):
        with django_assert_max_num_queries(14):
            assert client.get(sub_list, params).status_code == 200
    with django_assert_max_num_queries(30):
        page = client.get(reverse("admin:subscriptions_subscription_change", args=[thousand.pk]))
    assert page.status_code == 200 and "Blocking cycles (3)" in page.content.decode()
    with django_assert_max_num_queries(30):
        assert client.get(reverse("admin:dunning_dunningcycle_change",
                                  args=[DunningCycle.objects.filter(subscription=thousand).first().pk])
                          ).status_code == 200
