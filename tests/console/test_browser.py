"""The console and the customer page in Debian's Chromium against the live server (Playwright).

Screenshots land in var/screenshots/ (git-ignored).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse

from dunning.clock import trusted_now
from dunning.models import DunningCycle, IncidentSwitch
from tests.console.conftest import PASSWORD
from tests.support.browser import screenshot
from tests.support.builders import reload

pytestmark = pytest.mark.django_db(transaction=True)


def admin_login(page, live_server, user) -> None:
    page.goto(f"{live_server.url}/admin/login/")
    page.fill("#id_username", user.username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#site-name")


def customer_login(page, live_server, user) -> None:
    page.goto(f"{live_server.url}{reverse('billing-login')}")
    page.fill("#id_username", user.username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")


def console_url(sub, action: str, cycle=None) -> str:
    if cycle is None:
        return reverse("admin:subscriptions_subscription_console", args=[sub.pk, action])
    return reverse("admin:subscriptions_subscription_console_cycle", args=[sub.pk, action, cycle.pk])


def test_agent_grants_an_exception_and_the_customer_sees_the_new_date(
        live_server, new_page, agent, customer_a, grace_scene):
    sub, cycle = grace_scene.sub, grace_scene.cycle
    staff = new_page()
    admin_login(staff, live_server, agent)
    staff.goto(f"{live_server.url}{reverse('admin:subscriptions_subscription_change', args=[sub.pk])}")
    assert staff.locator("#blocking-cycles").inner_text().count("GRACE_ACTIVE") == 1
    assert staff.locator(f"#action-resolve_conflict-{cycle.pk}").count() == 0
    staff.click(f"#action-grant_exception-{cycle.pk}")
    expires = (trusted_now() + timedelta(days=9)).replace(hour=12, minute=0, second=0, microsecond=0)
    staff.fill("#id_expires_at", expires.strftime("%Y-%m-%dT%H:%M"))
    staff.select_option("#id_profile", "FULL")
    staff.fill("#id_reason", "Customer's bank is replacing a stolen card")
    staff.fill("#id_ticket", "SUP-4711")
    staff.click("#console-submit")
    assert "Granted an exception" in staff.locator("ul.messagelist").inner_text()
    assert "EXCEPTION_ACTIVE" in staff.locator("#blocking-cycles").inner_text()
    assert "accepted grant_exception" in staff.locator("#timeline").inner_text()
    screenshot(staff, "admin_subscription")
    assert reload(cycle).exception_expires_at == expires

    customer = new_page(mobile=True)
    customer_login(customer, live_server, customer_a)
    customer.wait_for_selector("#access-text")
    headline = customer.locator("#access-text").inner_text()
    assert f"Full access until {expires.day} {expires:%B}; after that read and export only" in headline
    assert "$49.00" in customer.content()
    screenshot(customer, "customer_billing")


def test_lead_resolves_a_conflict_seeing_both_receipts(live_server, new_page, lead, conflict_scene, provider_says):
    provider_says("paid")
    sub, cycle = conflict_scene.sub, conflict_scene.cycle
    page = new_page()
    admin_login(page, live_server, lead)
    page.goto(f"{live_server.url}{reverse('admin:subscriptions_subscription_change', args=[sub.pk])}")
    page.click(f"#action-resolve_conflict-{cycle.pk}")
    assert "paid receipt, then a failure" in page.locator("#older-evidence").inner_text()
    assert "invoice paid" in page.locator("#fresh-evidence").inner_text()
    screenshot(page, "admin_resolve_conflict")
    page.check("input[name=resolution][value=RECOVERED]")
    page.fill("#id_reason", "Provider shows the invoice paid; the failure was a late duplicate")
    page.fill("#id_ticket", "SUP-4712")
    page.click("#console-submit")
    assert "Resolved the conflict" in page.locator("ul.messagelist").inner_text()
    assert reload(cycle).state == "RECOVERED"


def test_agent_has_no_resolve_button_and_a_crafted_post_gets_403(
        live_server, new_page, agent, conflict_scene, provider_says):
    provider_says("paid")
    sub, cycle = conflict_scene.sub, conflict_scene.cycle
    page = new_page()
    admin_login(page, live_server, agent)
    page.goto(f"{live_server.url}{reverse('admin:subscriptions_subscription_change', args=[sub.pk])}")
    assert "EVIDENCE_CONFLICT" in page.locator("#blocking-cycles").inner_text()
    assert page.locator(f"#action-resolve_conflict-{cycle.pk}").count() == 0
    assert page.get_by_text("Resolve conflict").count() == 0
    token = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    response = page.request.post(f"{live_server.url}{console_url(sub, 'resolve_conflict', cycle)}",
                                 form={"csrfmiddlewaretoken": token, "resolution": "RECOVERED", "reason": "r",
                                       "ticket": "T"},
                                 headers={"Referer": f"{live_server.url}/admin/"})
    assert response.status == 403
    # The same token is good: the 403 is the permission, not CSRF (a permitted action goes through).
    ok = page.request.post(f"{live_server.url}{console_url(sub, 'resolve_conflict', cycle)}".replace(
        "resolve_conflict", "own_unknown_payment"), form={"csrfmiddlewaretoken": token, "reason": "r", "ticket": "T"},
        headers={"Referer": f"{live_server.url}/admin/"})
    assert ok.status == 200  # permitted; the form reports that this cycle is not an unknown payment
    assert reload(cycle).state == "EVIDENCE_CONFLICT"


def test_customer_a_cannot_open_customer_b_page(live_server, new_page, customer_a, customer_b, grace_scene,
                                               conflict_scene):
    page = new_page(mobile=True)
    customer_login(page, live_server, customer_a)
    page.wait_for_selector("#access-text")
    own = page.goto(f"{live_server.url}{reverse('billing-subscription', args=[grace_scene.sub.pk])}")
    assert own.status == 200
    other = page.goto(f"{live_server.url}{reverse('billing-subscription', args=[conflict_scene.sub.pk])}")
    assert other.status == 404
    assert "connor@example.com" not in page.content()


def test_csrf_is_enforced_on_every_action(live_server, new_page, lead, customer_a, grace_scene, conflict_scene):
    staff = new_page()
    admin_login(staff, live_server, lead)
    posts = [
        console_url(grace_scene.sub, "grant_exception", grace_scene.cycle),
        console_url(conflict_scene.sub, "resolve_conflict", conflict_scene.cycle),
        console_url(grace_scene.sub, "own_unknown_payment", grace_scene.cycle),
        console_url(grace_scene.sub, "request_cancellation", grace_scene.cycle),
        console_url(grace_scene.sub, "pause_restrictions"),
        console_url(grace_scene.sub, "rebind_policy"),
        console_url(grace_scene.sub, "end_incident"),
    ]
    expires = (trusted_now() + timedelta(days=2)).strftime("%Y-%m-%dT%H:%M")
    form = {"expires_at": expires, "profile": "FULL", "resolution": "RECOVERED", "reason": "r", "ticket": "T"}
    for url in posts:
        response = staff.request.post(f"{live_server.url}{url}", form=form)
        assert response.status == 403, url
        assert "CSRF" in response.text(), url

    customer = new_page()
    customer_login(customer, live_server, customer_a)
    customer.wait_for_selector("#access-text")
    retry = reverse("billing-retry-now", args=[grace_scene.sub.pk, grace_scene.cycle.pk])
    for url in (retry, reverse("billing-logout")):
        response = customer.request.post(f"{live_server.url}{url}", form={})
        assert response.status == 403 and "CSRF" in response.text(), url
    states = dict(DunningCycle.objects.values_list("pk", "state"))
    assert states == {grace_scene.cycle.pk: "GRACE_ACTIVE", conflict_scene.cycle.pk: "EVIDENCE_CONFLICT"}
    assert not IncidentSwitch.objects.exists()
