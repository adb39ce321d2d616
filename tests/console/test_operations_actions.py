"""Issue 15 in the admin: held provider events show why they were held and can be fetched again
and re-processed by a billing lead (reason, ticket, audited); alerts are acknowledged and resolved
from their list and their page. Actions a user may not take are neither shown nor accepted."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

from dunning.actions.alerts import alert_raise
from dunning.clock import trusted_now
from dunning.models import Alert, AlertKind, DunningCycle, EventOutcome, ProviderEvent
from dunning.models.inbox import EventReprocessing
from dunning.models.operations import AlertAction
from tests.console.conftest import PASSWORD
from tests.support.actors import perms_of
from tests.support.scenarios import bring_back, failed_renewal_quarantined

pytestmark = pytest.mark.django_db


def test_the_roles_get_the_new_decisions_from_the_migration():
    agents, leads = perms_of("Support agents"), perms_of("Billing leads")
    handling = {"dunning.acknowledge_alert", "dunning.resolve_alert", "dunning.view_alert",
                "dunning.view_alertaction", "dunning.view_eventreprocessing"}
    assert agents >= handling and "dunning.reprocess_event" not in agents
    assert leads >= handling | {"dunning.reprocess_event"}


# --------------------------------------------------------------------------- held provider events


def inbox(event_id: str, outcome: str, detail: str, *, obj: dict | None = None) -> ProviderEvent:
    now = trusted_now()
    obj = obj or {"id": f"in_{event_id}", "object": "invoice"}
    return ProviderEvent.objects.create(
        event_id=event_id, event_type="invoice.payment_failed", account="acct_demo",
        payload={"id": event_id, "type": "invoice.payment_failed", "data": {"object": obj}},
        signature_verified=True, received_at=now - timedelta(minutes=5), processed_at=now - timedelta(minutes=5),
        outcome=outcome, outcome_detail=detail, attempts=1)


LIST = reverse("admin:dunning_providerevent_changelist")


def event_page(event: ProviderEvent) -> str:
    return reverse("admin:dunning_providerevent_change", args=[event.pk])


def reprocess_url(event: ProviderEvent) -> str:
    return reverse("admin:dunning_providerevent_reprocess", args=[event.pk])


def test_the_event_list_says_why_each_event_was_held_and_filters_the_held_ones(client, lead, agent):
    held = inbox("evt_held", EventOutcome.QUARANTINED, "provider has no invoice in_evt_held")
    orphan = inbox("evt_orphan", EventOutcome.UNATTRIBUTABLE, "payment pi_9 is not linked to any invoice we know")
    inbox("evt_fine", EventOutcome.APPLIED, "grace_start: CURRENT→GRACE_ACTIVE")
    client.force_login(lead)

    page = client.get(LIST, {"held": "held"}).content.decode()

    assert "provider has no invoice in_evt_held" in page and "not linked to any invoice we know" in page
    assert "evt_fine" not in page
    assert reprocess_url(held) in page and reprocess_url(orphan) in page
    everything = client.get(LIST).content.decode()
    assert "evt_fine" in everything and "grace_start: CURRENT→GRACE_ACTIVE" in everything
    client.force_login(agent)
    as_agent = client.get(LIST, {"held": "held"}).content.decode()
    assert "provider has no invoice in_evt_held" in as_agent and reprocess_url(held) not in as_agent


def test_a_lead_reprocesses_a_quarantined_event_from_its_page(client, lead, sim):
    sub_id, invoice, event = failed_renewal_quarantined(sim, email="held@example.com")
    invoice_id = invoice["id"]
    bring_back(sim, invoice)
    client.force_login(lead)

    page = client.get(event_page(event)).content.decode()
    assert "Held: QUARANTINED" in page and f"provider has no invoice {invoice_id}" in page
    assert 'id="reprocess-form"' in page and f"invoice {invoice_id}" in page

    done = client.post(reprocess_url(event), {"reason": "provider has the invoice now", "ticket": "OPS-12"},
                       follow=True)

    text = done.content.decode()
    assert done.redirect_chain[-1][0] == event_page(event)
    assert f"Re-processed event {event.event_id} for subscription {sub_id}: QUARANTINED → APPLIED" in text
    assert 'id="reprocess-history"' in text and "OPS-12" in text and "provider has the invoice now" in text
    assert 'id="reprocess-form"' not in text, "no longer held: nothing to re-process"
    row = EventReprocessing.objects.get(event=event)
    assert (row.actor, row.previous_outcome, row.new_outcome) == ("lead", "QUARANTINED", "APPLIED")
    assert DunningCycle.objects.get(invoice__provider_invoice_id=invoice_id).state in ("GRACE_ACTIVE",
                                                                                        "RETRY_SCHEDULED")


def test_reprocessing_asks_for_a_reason_and_a_ticket(client, lead):
    event = inbox("evt_q", EventOutcome.QUARANTINED, "provider has no invoice in_evt_q")
    client.force_login(lead)
    form = client.get(reprocess_url(event)).content.decode()
    assert "Fetch again and re-process" in form and "provider has no invoice in_evt_q" in form
    response = client.post(reprocess_url(event), {"reason": "", "ticket": ""})
    assert response.status_code == 200 and response.content.decode().count("This field is required") == 2
    assert not EventReprocessing.objects.exists()


def test_an_event_that_is_not_held_is_refused_in_words(client, lead):
    event = inbox("evt_ok", EventOutcome.APPLIED, "recover: CURRENT→RECOVERED")
    client.force_login(lead)
    page = client.get(event_page(event)).content.decode()
    assert 'id="reprocess-form"' not in page and "Held:" not in page
    response = client.post(reprocess_url(event), {"reason": "why not", "ticket": "T-1"})
    assert response.status_code == 200
    assert "Refused: Event evt_ok is not held: it was processed on" in response.content.decode()
    assert not EventReprocessing.objects.exists()


def test_an_agent_sees_why_but_has_no_reprocess_and_a_crafted_post_is_403(client, agent):
    event = inbox("evt_q2", EventOutcome.QUARANTINED, "provider has no invoice in_evt_q2")
    client.force_login(agent)
    page = client.get(event_page(event)).content.decode()
    assert "provider has no invoice in_evt_q2" in page and 'id="reprocess-form"' not in page
    assert "A billing lead can fetch this event again" in page
    assert client.post(reprocess_url(event), {"reason": "r", "ticket": "T"}).status_code == 403
    assert client.get(reprocess_url(event)).status_code == 403
    assert not EventReprocessing.objects.exists()


# --------------------------------------------------------------------------- alerts

ALERTS = reverse("admin:dunning_alert_changelist")


def an_alert(key: str = "duplicate_charge:in_7", kind: str = AlertKind.DUPLICATE_CHARGE) -> Alert:
    return alert_raise(kind=kind, dedupe_key=key, detail=f"Invoice {key} looks charged twice", figures={},
                       now=trusted_now())


def alert_page(alert: Alert) -> str:
    return reverse("admin:dunning_alert_change", args=[alert.pk])


def test_the_alert_list_opens_on_open_alerts(client, agent, lead):
    open_one = an_alert("duplicate_charge:in_open")
    done = an_alert("duplicate_charge:in_done")
    client.force_login(lead)
    client.post(reverse("admin:dunning_alert_resolve", args=[done.pk]), {"note": "refunded"}, follow=True)
    client.force_login(agent)

    default = client.get(ALERTS).content.decode()

    assert "in_open" in default and "in_done" not in default and "nobody owns it" in default
    assert "in_done" in client.get(ALERTS, {"status": "all"}).content.decode()
    resolved = client.get(ALERTS, {"status": "resolved"}).content.decode()
    assert "in_done" in resolved and "in_open" not in resolved
    assert Alert.objects.get(pk=open_one.pk).resolved_at is None


def test_an_agent_acknowledges_then_resolves_from_the_alert_page(client, agent):
    alert = an_alert()
    client.force_login(agent)
    page = client.get(alert_page(alert)).content.decode()
    assert "Open — nobody owns it yet" in page and 'id="acknowledge-form"' in page and 'id="resolve-form"' in page
    assert "stays open until a person resolves it" in page

    taken = client.post(reverse("admin:dunning_alert_acknowledge", args=[alert.pk]),
                        {"note": "checking the provider"}, follow=True).content.decode()
    assert "You own this alert now" in taken and "Open — agent owns it" in taken
    assert 'id="acknowledge-form"' not in taken, "nothing to take: it is yours"

    blank = client.post(reverse("admin:dunning_alert_resolve", args=[alert.pk]), {"note": ""})
    assert blank.status_code == 200 and "This field is required" in blank.content.decode()
    assert Alert.objects.get(pk=alert.pk).resolved_at is None

    done = client.post(reverse("admin:dunning_alert_resolve", args=[alert.pk]),
                       {"note": "refunded the second charge"}, follow=True).content.decode()
    assert "Resolved:" in done and "Resolved by agent" in done and "refunded the second charge" in done
    assert 'id="resolve-form"' not in done
    assert list(AlertAction.objects.filter(alert=alert).order_by("pk").values_list("action", "actor", "note")) == [
        ("ACKNOWLEDGE", "agent", "checking the provider"), ("RESOLVE", "agent", "refunded the second charge")]
    again = client.post(reverse("admin:dunning_alert_resolve", args=[alert.pk]), {"note": "again"})
    assert "Refused: This alert was already resolved by agent" in again.content.decode()


def test_list_actions_acknowledge_and_resolve_the_selected_alerts(client, lead):
    first, second = an_alert("duplicate_charge:in_a"), an_alert("duplicate_charge:in_b")
    client.force_login(lead)
    selected = {"_selected_action": [first.pk, second.pk]}

    taken = client.post(ALERTS, {"action": "acknowledge_selected", **selected}, follow=True).content.decode()
    assert "You now own 2 alert(s)" in taken
    assert set(Alert.objects.values_list("owner__username", flat=True)) == {"lead"}

    confirm = client.post(ALERTS, {"action": "resolve_selected", **selected})
    assert confirm.status_code == 200 and 'id="resolve-list"' in confirm.content.decode()
    assert Alert.objects.filter(resolved_at__isnull=False).count() == 0
    unsaid = client.post(ALERTS, {"action": "resolve_selected", "confirm": "yes", "note": "", **selected})
    assert "This field is required" in unsaid.content.decode()
    done = client.post(ALERTS, {"action": "resolve_selected", "confirm": "yes", "note": "duplicates refunded",
                                **selected}, follow=True).content.decode()
    assert "Resolved 2 alert(s)" in done
    assert set(Alert.objects.values_list("resolution_note", flat=True)) == {"duplicates refunded"}
    assert AlertAction.objects.filter(action="RESOLVE", actor="lead").count() == 2


def test_without_the_permissions_nothing_is_offered_and_a_crafted_post_is_403(client, django_user_model):
    alert = an_alert()
    viewer = django_user_model.objects.create_user("viewer", password=PASSWORD, is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_alert", content_type__app_label="dunning"))
    client.force_login(viewer)
    listing = client.get(ALERTS).content.decode()
    assert "duplicate_charge:in_7" in listing or "looks charged twice" in listing
    assert "acknowledge_selected" not in listing and "resolve_selected" not in listing
    page = client.get(alert_page(alert)).content.decode()
    assert 'id="acknowledge-form"' not in page and 'id="resolve-form"' not in page
    assert client.post(reverse("admin:dunning_alert_resolve", args=[alert.pk]), {"note": "x"}).status_code == 403
    assert client.post(reverse("admin:dunning_alert_acknowledge", args=[alert.pk]), {}).status_code == 403
    client.post(ALERTS, {"action": "resolve_selected", "confirm": "yes", "note": "x", "_selected_action": [alert.pk]})
    assert Alert.objects.get(pk=alert.pk).resolved_at is None and not AlertAction.objects.exists()
