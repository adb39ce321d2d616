"""Every admin page of the foundation renders for a superuser, and protected models cannot be
changed through it."""

import io

import pytest
from django.contrib import admin
from django.core.management import call_command
from django.urls import reverse

from dunning.models import DunningCycle
from subscriptions.models import Subscription


@pytest.fixture
def demo(db):
    call_command("load_demo", stdout=io.StringIO())


def test_changelists_and_change_pages_render(demo, admin_client):
    for model in admin.site._registry:
        opts = model._meta
        response = admin_client.get(reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist"))
        assert response.status_code == 200, opts.label
        obj = model.objects.first()
        if obj is not None:
            page = admin_client.get(reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[obj.pk]))
            assert page.status_code == 200, opts.label


def test_protected_models_cannot_be_posted_to(demo, admin_client):
    cycle = DunningCycle.objects.filter(state="RESTRICTED").first()
    url = reverse("admin:dunning_dunningcycle_change", args=[cycle.pk])
    admin_client.post(url, {"state": "RECOVERED"})
    cycle.refresh_from_db()
    assert cycle.state == "RESTRICTED"
    sub = Subscription.objects.get(provider_subscription_id="sub_demo_restricted")
    response = admin_client.post(reverse("admin:subscriptions_subscription_delete", args=[sub.pk]), {"post": "yes"})
    assert response.status_code == 403
    assert Subscription.objects.filter(pk=sub.pk).exists()
