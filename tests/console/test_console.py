"""Support console (SPEC §11): roles from the migration, actions through the acceptance service
with reason and ticket, refusals shown, forbidden actions neither shown nor accepted."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse

from dunning.clock import trusted_now
from dunning.models import DunningCycle, IncidentSwitch, ProviderReceipt, TransitionReceipt
from subscriptions.models import Subscription
from tests.support.actors import perms_of
from tests.support.builders import make_policy, make_subscription, open_cycle, reload, restrict

AGENT_CAN = {"dunning.grant_exception", "dunning.own_unknown_payment", "subscriptions.view_subscription",
             "dunning.view_monetaryfact", "dunning.view_transitionreceipt"}
LEAD_ONLY = {"dunning.resolve_conflict", "dunning.request_cancellation", "dunning.incident_switch",
             "dunning.rebind_policy", "dunning.add_dunningpolicy"}


def page_url(sub: Subscription) -> str:
    return reverse("admin:subscriptions_subscription_change", args=[sub.pk])


def action_url(sub: Subscription, action: str, cycle: DunningCycle | None = None) -> str:
    if cycle is None:
        return reverse("admin:subscriptions_subscription_console", args=[sub.pk, action])
    return reverse("admin:subscriptions_subscription_console_cycle", args=[sub.pk, action, cycle.pk])


@pytest.mark.django_db
def test_roles_come_from_the_migration_without_any_fixture():
    agents, leads = perms_of("Support agents"), perms_of("Billing leads")
    assert agents >= AGENT_CAN
    assert not (LEAD_ONLY & agents)
    assert leads >= AGENT_CAN | LEAD_ONLY
    assert not any(p.startswith(("subscriptions.change_", "subscriptions.delete_", "dunning.change_"))
                   for p in agents | leads)


def test_agent_grants_an_exception_with_reason_and_ticket(client, agent, grace_scene):
    sub, cycle = grace_scene.sub, grace_scene.cycle
    client.force_login(agent)
    page = client.get(page_url(sub)).content.decode()
    assert "Grant exception" in page and "Resolve conflict" not in page
    form = client.get(action_url(sub, "grant_exception", cycle))
    assert form.status_code == 200 and "The policy allows at most 14 days" in form.content.decode()
    expires = (trusted_now() + timedelta(days=5)).replace(second=0, microsecond=0)
    response = client.post(action_url(sub, "grant_exception", cycle), {
        "expires_at": expires.strftime("%Y-%m-%dT%H:%M"), "profile": "FULL", "reason": "customer in hospital",
        "ticket": "SUP-7"}, follow=True)
    text = response.content.decode()
    assert "Granted an exception" in text and "Access is now FULL" in text
    cycle = reload(cycle)
    assert cycle.state == "EXCEPTION_ACTIVE" and cycle.exception_expires_at == expires
    receipt = TransitionReceipt.objects.filter(cycle=cycle).latest("id")
    assert (receipt.accepted, receipt.actor, receipt.reason, receipt.ticket) == (True, "agent", "customer in hospital",
                                                                                "SUP-7")


def test_an_exception_longer_than_the_policy_allows_is_refused_on_the_form(client, agent, grace_scene):
    sub, cycle = grace_scene.sub, grace_scene.cycle
    client.force_login(agent)
    too_late = trusted_now() + timedelta(days=30)
    response = client.post(action_url(sub, "grant_exception", cycle), {
        "expires_at": too_late.strftime("%Y-%m-%dT%H:%M"), "profile": "FULL", "reason": "r", "ticket": "T"})
    assert response.status_code == 200
    assert "at the latest" in response.content.decode()
    assert reload(cycle).state == "GRACE_ACTIVE"


def test_reason_and_ticket_are_required(client, agent, grace_scene):
    client.force_login(agent)
    expires = trusted_now() + timedelta(days=2)
    response = client.post(action_url(grace_scene.sub, "grant_exception", grace_scene.cycle),
                           {"expires_at": expires.strftime("%Y-%m-%dT%H:%M"), "profile": "FULL"})
    assert response.status_code == 200 and response.content.decode().count("This field is required") == 2
    assert reload(grace_scene.cycle).state == "GRACE_ACTIVE"


@pytest.mark.parametrize("action", ["resolve_conflict", "request_cancellation", "pause_restrictions", "end_incident",
                                    "rebind_policy"])
def test_agent_is_refused_lead_actions_with_403(client, agent, conflict_scene, action):
    client.force_login(agent)
    cycle = conflict_scene.cycle if action in ("resolve_conflict", "request_cancellation") else None
    url = action_url(conflict_scene.sub, action, cycle)
    assert client.get(url).status_code == 403
    assert client.post(url, {"reason": "r", "ticket": "T", "resolution": "RECOVERED"}).status_code == 403
    assert reload(conflict_scene.cycle).state == "EVIDENCE_CONFLICT"
    assert not IncidentSwitch.objects.exists()


def test_lead_sees_both_receipts_and_resolves_after_a_fresh_fetch(client, lead, conflict_scene, provider_says):
    sub, cycle = conflict_scene.sub, conflict_scene.cycle
    provider = provider_says("paid")
    client.force_login(lead)
    assert "Resolve conflict" in client.get(page_url(sub)).content.decode()
    form = client.get(action_url(sub, "resolve_conflict", cycle)).content.decode()
    assert "paid receipt, then a failure" in form and 'id="fresh-evidence"' in form
    assert provider.fetches == 1
    response = client.post(action_url(sub, "resolve_conflict", cycle),
                           {"resolution": "RECOVERED", "reason": "bank confirms payment", "ticket": "SUP-9"},
                           follow=True)
    assert "Resolved the conflict" in response.content.decode()
    assert provider.fetches == 2  # the decision fetched again
    cycle = reload(cycle)
    assert cycle.state == "RECOVERED"
    receipt = TransitionReceipt.objects.filter(cycle=cycle, edge="resolve_conflict").get()
    assert receipt.evidence_receipt == ProviderReceipt.objects.latest("id")
    assert Subscription.objects.get(pk=sub.pk).entitlement_profile == "FULL"


def test_a_resolution_the_fresh_receipt_contradicts_is_refused(client, lead, conflict_scene, provider_says):
    provider_says("open")
    client.force_login(lead)
    response = client.post(action_url(conflict_scene.sub, "resolve_conflict", conflict_scene.cycle),
                           {"resolution": "RECOVERED", "reason": "r", "ticket": "T"})
    assert "RESOLUTION_CONTRADICTS_RECEIPT" in response.content.decode()
    assert reload(conflict_scene.cycle).state == "EVIDENCE_CONFLICT"
    assert TransitionReceipt.objects.filter(edge="resolve_conflict", accepted=False).count() == 1


def test_lead_requests_cancellation_of_a_restricted_cycle(client, lead, grace_scene):
    restrict(grace_scene.cycle)
    client.force_login(lead)
    response = client.post(action_url(grace_scene.sub, "request_cancellation", grace_scene.cycle),
                           {"reason": "no answer for 30 days", "ticket": "SUP-11"}, follow=True)
    assert "Requested cancellation" in response.content.decode()
    assert reload(grace_scene.cycle).state == "CANCEL_PENDING"


def test_lead_pauses_restrictions_for_the_cohort(client, lead, grace_scene):
    client.force_login(lead)
    response = client.post(action_url(grace_scene.sub, "pause_restrictions"),
                           {"reason": "provider outage", "ticket": "INC-3"}, follow=True)
    assert "Paused new restrictions" in response.content.decode()
    switch = IncidentSwitch.objects.get()
    assert (switch.cohort, switch.ticket, switch.started_by) == ("default", "INC-3", lead)
    again = client.post(action_url(grace_scene.sub, "pause_restrictions"), {"reason": "x", "ticket": "INC-4"})
    assert "already pauses restrictions" in again.content.decode()


def test_lead_rebinds_to_the_previous_policy_version(client, lead, policy):
    newer = make_policy(policy="test-monthly@2")
    sub = make_subscription()
    assert sub.policy == newer
    cycle = open_cycle(sub)
    client.force_login(lead)
    response = client.post(action_url(sub, "rebind_policy"), {"reason": "v2 too strict", "ticket": "INC-5"},
                           follow=True)
    assert "Rebound" in response.content.decode()
    assert Subscription.objects.get(pk=sub.pk).policy == policy
    assert reload(cycle).policy == policy


def test_subscription_page_shows_root_profile_verdict_and_one_timeline(client, agent, grace_scene):
    client.force_login(agent)
    text = client.get(page_url(grace_scene.sub)).content.decode()
    for expected in ("Blocking cycles (1)", "GRACE_ACTIVE", "READ_EXPORT_NO_NEW_JOBS — read and export only",
                     "Outstanding root", 'id="verdict-status"', 'id="timeline"', "accepted start_grace",
                     "accepted record_failure", "history (changed)"):
        assert expected in text, expected


def test_changelist_filters_and_search(client, agent, grace_scene, conflict_scene):
    client.force_login(agent)
    url = reverse("admin:subscriptions_subscription_changelist")
    conflict_only = client.get(url, {"cycle_state": "EVIDENCE_CONFLICT"}).content.decode()
    assert conflict_scene.sub.provider_subscription_id in conflict_only
    assert grace_scene.sub.provider_subscription_id not in conflict_only
    by_email = client.get(url, {"q": "ada@example.com"}).content.decode()
    assert grace_scene.sub.provider_subscription_id in by_email
    assert conflict_scene.sub.provider_subscription_id not in by_email
    by_invoice = client.get(url, {"q": conflict_scene.cycle.invoice.provider_invoice_id}).content.decode()
    assert conflict_scene.sub.provider_subscription_id in by_invoice
    assert grace_scene.sub.provider_subscription_id not in by_invoice
    young = client.get(url, {"age": "day"}).content.decode()
    assert grace_scene.sub.provider_subscription_id in young
    assert grace_scene.sub.provider_subscription_id not in client.get(url, {"age": "older"}).content.decode()
    for params in ({"owner": "mine"}, {"owner": "unowned"}, {"policy__id__exact": grace_scene.sub.policy_id}):
        assert client.get(url, params).status_code == 200
    cycles = client.get(reverse("admin:dunning_dunningcycle_changelist"), {"owner": "mine", "age": "week"})
    assert cycles.status_code == 200


def test_owner_filter_finds_the_exception_owner(client, agent, grace_scene):
    client.force_login(agent)
    expires = trusted_now() + timedelta(days=3)
    client.post(action_url(grace_scene.sub, "grant_exception", grace_scene.cycle), {
        "expires_at": expires.strftime("%Y-%m-%dT%H:%M"), "profile": "FULL", "reason": "r", "ticket": "T"})
    url = reverse("admin:subscriptions_subscription_changelist")
    assert grace_scene.sub.provider_subscription_id in client.get(url, {"owner": "mine"}).content.decode()
    assert grace_scene.sub.provider_subscription_id not in client.get(url, {"owner": "unowned"}).content.decode()


def test_money_facts_and_receipts_stay_read_only_for_leads(client, lead, grace_scene):
    client.force_login(lead)
    for model in ("monetaryfact", "providerreceipt", "transitionreceipt"):
        assert client.get(reverse(f"admin:dunning_{model}_changelist")).status_code == 200
        assert client.get(reverse(f"admin:dunning_{model}_add")).status_code == 403
    assert client.post(page_url(grace_scene.sub), {"entitlement_profile": "FULL"}).status_code == 403


def test_lead_ends_the_incident_and_every_subscription_of_the_cohort_is_reissued(client, lead, grace_scene):
    client.force_login(lead)
    before = Subscription.objects.get(pk=grace_scene.sub.pk).entitlement_generation
    nothing = client.post(action_url(grace_scene.sub, "end_incident"), {"reason": "over", "ticket": "INC-3"})
    assert "no incident pauses restrictions" in nothing.content.decode()
    client.post(action_url(grace_scene.sub, "pause_restrictions"), {"reason": "provider outage", "ticket": "INC-3"})
    response = client.post(action_url(grace_scene.sub, "end_incident"), {"reason": "over", "ticket": "INC-3"},
                           follow=True)
    assert "Ended incident INC-3" in response.content.decode()
    assert IncidentSwitch.objects.get().ended_by == lead
    assert Subscription.objects.get(pk=grace_scene.sub.pk).entitlement_generation == before + 1
