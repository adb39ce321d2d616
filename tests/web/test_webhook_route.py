"""The provider webhook goes from the first middleware straight to its view (dunning.web.webhooks.
WebhookRoute): no session, auth, messages, CSRF, history or browser-header middleware on it, while
every other URL keeps the whole chain. Its answers stay what they were: a bad delivery is kept and
refused with a 400, a bad Host is a 400, a GET a 405, an unknown provider a 404."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import Client

from dunning.models import Verification, WebhookDelivery
from tests.support.actors import LEADS, make_staff
from tests.support.signing import event_body, stripe_signature

SECRET = "whsec_local"
URL = "/webhooks/stripe/"


@pytest.fixture(autouse=True)
def webhook_settings(settings):
    settings.STRIPE_WEBHOOK_SECRETS = [SECRET]
    settings.STRIPE_ACCOUNT = "acct_demo"


def post(body: bytes, signature: str, **extra):
    return Client().post(URL, data=body, content_type="application/json", HTTP_STRIPE_SIGNATURE=signature, **extra)


def test_the_route_is_the_first_middleware():
    assert settings.MIDDLEWARE[0] == "dunning.web.webhooks.WebhookRoute"


def test_a_delivery_skips_the_rest_of_the_chain(db, monkeypatch):
    ran: list[str] = []
    # The session and messages middleware would each touch these on the way in; neither runs.
    monkeypatch.setattr("django.contrib.sessions.middleware.SessionMiddleware.process_request",
                        lambda self, request: ran.append("session"))
    monkeypatch.setattr("django.contrib.messages.middleware.MessageMiddleware.process_request",
                        lambda self, request: ran.append("messages"))
    body = event_body("evt_route", "invoice.paid")
    response = post(body, stripe_signature(body, SECRET))
    assert response.status_code == 200 and response.json()["event"] == "evt_route"
    assert ran == []
    assert "X-Frame-Options" not in response.headers and not response.cookies  # clickjacking / session: not run
    assert response.headers["Content-Length"] == str(len(response.content))
    assert response.resolver_match.url_name == "provider-webhook"


def test_a_bad_signature_is_still_kept_and_answered_400(db):
    body = event_body("evt_forged", "invoice.paid")
    response = post(body, stripe_signature(body, "whsec_wrong"))
    assert response.status_code == 400
    kept = WebhookDelivery.objects.get()
    assert kept.verification == Verification.REJECTED and kept.http_status == 400 and bytes(kept.body) == body


def test_a_host_outside_allowed_hosts_is_refused_before_anything_is_kept(db):
    body = event_body("evt_host", "invoice.paid")
    response = post(body, stripe_signature(body, SECRET), HTTP_HOST="evil.example")
    assert response.status_code == 400
    assert not WebhookDelivery.objects.exists()


def test_other_methods_and_unknown_providers_answer_as_before(db):
    assert Client().get(URL).status_code == 405
    assert Client().post("/webhooks/nope/", data=b"{}", content_type="application/json").status_code == 404
    assert not WebhookDelivery.objects.exists()


def test_the_admin_keeps_the_whole_chain(db):
    anonymous = Client().get("/admin/")
    assert anonymous.status_code == 302 and "/admin/login/" in anonymous["Location"]  # auth and sessions ran
    assert anonymous.headers["X-Frame-Options"] == "DENY"
    staff = Client(enforce_csrf_checks=True)
    staff.force_login(make_staff("lead", LEADS))
    page = staff.get("/admin/")
    assert page.status_code == 200 and page.wsgi_request.user.is_staff
    refused = staff.post("/admin/logout/")  # no CSRF token: the CSRF middleware still refuses it
    assert refused.status_code == 403


urlpatterns: list = []  # a URLconf without the webhook, for the test below


def test_the_route_follows_the_urlconf_it_is_resolved_in(db, settings):
    body = event_body("evt_elsewhere", "invoice.paid")
    assert post(body, stripe_signature(body, SECRET)).status_code == 200  # resolved (and cached) in config.urls
    settings.ROOT_URLCONF = __name__
    again = event_body("evt_nowhere", "invoice.paid")
    assert post(again, stripe_signature(again, SECRET)).status_code == 404
    assert not WebhookDelivery.objects.filter(claimed_event_id="evt_nowhere").exists()
