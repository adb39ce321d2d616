"""Every admin page of the foundation renders for a superuser, and protected models cannot be
changed through it."""

import io

import pytest
from django.contrib import admin
from django.core.management import call_command
from django.urls import reverse

from dunning.models import DunningCycle, OutboxMessage, ReconciliationReport
from subscriptions.models import Subscription


@pytest.fixture
def demo(db, django_user_model):
    from dunning.actions.alerts import alert_raise
    from dunning.actions.incidents import incident_end, incident_start
    from dunning.actions.notifications import notification_deliver
    from dunning.jobs.framework import job_run

    call_command("load_demo", stdout=io.StringIO())
    # Operations pages need rows too: a job run, a delivered notice, an alert, an ended incident.
    run = job_run("reminders")
    notice = OutboxMessage.objects.filter(topic="notification.requested").first()
    notification_deliver(notice, now=run.run_for)
    alert_raise(kind="DUPLICATE_CHARGE", dedupe_key="smoke", detail="two charges", figures={"n": 2}, now=run.run_for)
    ReconciliationReport.objects.create(run_for=run.run_for, window_start=run.run_for, window_end=run.run_for,
                                        created_at=run.run_for, totals={"invoices": 1},
                                        discrepancies=[{"kind": "ROOT_MISMATCH", "detail": "smoke"}])
    lead = django_user_model.objects.create_user("incident-lead", password="x")
    incident_end(switch=incident_start(user=lead, reason="drill", ticket="INC-0"), user=lead)


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
