"""Issue 15 in Debian's Chromium against the live server: a billing lead re-processes a quarantined
provider event (the Stripe simulator now has the invoice) and resolves a duplicate-charge alert.

Screenshots land in var/screenshots/ops_*.png (git-ignored).
"""

from __future__ import annotations

from importlib import import_module

import pytest
from django.apps import apps
from django.urls import reverse

from dunning.actions.alerts import alert_raise
from dunning.clock import trusted_now
from dunning.models import Alert, AlertKind, DunningCycle
from dunning.models.inbox import EventReprocessing
from dunning.models.operations import AlertAction
from subscriptions.models import Subscription
from tests.console.test_browser import admin_login
from tests.support.browser import screenshot
from tests.support.scenarios import bring_back, failed_renewal_quarantined

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def operations_roles(roles):
    """The live server's database was flushed: re-apply this issue's grants after the roles."""
    import_module("dunning.migrations.0010_event_reprocessing_and_alert_handling").grant(apps, None)


def quarantined_payment_failure(sim):
    """The provider's reads lag: the invoice is not found while its events arrive; then it is."""
    sub_id, invoice, event = failed_renewal_quarantined(sim, email="grace.hopper@example.com")
    bring_back(sim, invoice)
    return sub_id, invoice["id"], event


def test_lead_reprocesses_a_quarantined_event_and_resolves_an_alert(live_server, new_page, operations_roles, lead,
                                                                    sim):
    sub_id, invoice_id, event = quarantined_payment_failure(sim)
    sub = Subscription.objects.get(provider_subscription_id=sub_id)
    alert = alert_raise(
        kind=AlertKind.DUPLICATE_CHARGE, dedupe_key="duplicate_charge:in_demo_twice", subscription=sub,
        detail="Invoice in_demo_twice (4900 USD) looks charged more than once, according to money facts: payment "
               "references pi_demo_1, pi_demo_2; 0 succeeded attempt(s); charges —. Check the provider and refund "
               "the extra charge.", figures={"payment_refs": ["pi_demo_1", "pi_demo_2"]}, now=trusted_now())
    page = new_page()
    admin_login(page, live_server, lead)

    page.goto(f"{live_server.url}{reverse('admin:dunning_providerevent_changelist')}?held=held")
    listing = page.locator("#result_list").inner_text()
    assert event.event_id in listing and f"provider has no invoice {invoice_id}" in listing
    screenshot(page, "ops_events_held")

    page.click(f"text={event.event_id}")
    panel = page.locator("#event-panel")
    assert "Held: QUARANTINED" in panel.inner_text()
    assert f"provider has no invoice {invoice_id}" in page.locator("#event-why").inner_text()
    page.fill("#reprocess-form textarea[name=reason]", "Provider support confirmed the invoice exists now")
    page.fill("#reprocess-form input[name=ticket]", "OPS-4711")
    screenshot(page, "ops_event_held")
    page.click("#reprocess-submit")

    message = page.locator("ul.messagelist").inner_text()
    assert f"Re-processed event {event.event_id} for subscription {sub_id}: QUARANTINED → APPLIED" in message
    history = page.locator("#reprocess-history").inner_text()
    assert "OPS-4711" in history and "QUARANTINED" in history and "APPLIED" in history
    assert page.locator("#reprocess-form").count() == 0
    screenshot(page, "ops_event_reprocessed")
    row = EventReprocessing.objects.get(event=event)
    assert (row.actor, row.ticket, row.previous_outcome, row.new_outcome) == ("lead", "OPS-4711", "QUARANTINED",
                                                                              "APPLIED")
    cycle = DunningCycle.objects.select_related("subscription").get(invoice__provider_invoice_id=invoice_id)
    assert cycle.state in ("GRACE_ACTIVE", "RETRY_SCHEDULED")
    assert cycle.subscription.entitlement_profile == "READ_EXPORT_NO_NEW_JOBS"

    page.goto(f"{live_server.url}{reverse('admin:dunning_alert_changelist')}")
    assert "nobody owns it" in page.locator("#result_list").inner_text()
    screenshot(page, "ops_alerts_open")
    page.click("#result_list tbody tr th a")
    assert "Open — nobody owns it yet" in page.locator("#alert-status").inner_text()
    page.fill("#resolve-note", "Refunded pi_demo_2 in the provider dashboard; customer told by email")
    screenshot(page, "ops_alert_open")
    page.click("#resolve-submit")

    assert "Resolved:" in page.locator("ul.messagelist").inner_text()
    assert "Resolved by lead" in page.locator("#alert-status").inner_text()
    assert "Refunded pi_demo_2" in page.locator("#alert-resolution").inner_text()
    screenshot(page, "ops_alert_resolved")
    alert.refresh_from_db()
    assert (alert.resolved_by, alert.resolution_note) == ("lead", "Refunded pi_demo_2 in the provider dashboard; "
                                                                   "customer told by email")
    assert list(AlertAction.objects.filter(alert=alert).values_list("action", "actor")) == [("RESOLVE", "lead")]
    page.goto(f"{live_server.url}{reverse('admin:dunning_alert_changelist')}")
    assert not Alert.objects.filter(resolved_at__isnull=True).exists()
    assert "0 alerts" in page.locator("#changelist").inner_text() or "in_demo_twice" not in page.content()
