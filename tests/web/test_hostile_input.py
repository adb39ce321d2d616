"""Bad input is a clear 4xx, never a 500 (issue 15, item 9).

Two classes of input reached PostgreSQL and failed there: a NUL character (PostgreSQL holds none
in text, varchar or jsonb) and a value longer than its column. Every path is driven through the
real HTTP stack: the signed webhook, the REST API (ids in the path, the query string, bodies, the
Idempotency-Key header, policy documents), the admin (search, filters, ids, history, action
selections) and the session cookie.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import yaml
from django.test import Client

from dunning.clock import trusted_now
from dunning.models import DunningPolicy, ProviderEvent, TransitionReceipt, WebhookDelivery
from entitlements.models import IdempotencyRecord
from tests.support.actors import LEADS, make_staff, session_client
from tests.support.builders import fail_first_payment, make_subscription, open_cycle, policy_document
from tests.support.signing import event_body, stripe_signature

SECRET = "whsec_local"
NUL = "\x00"
PROBLEM_BASE = "https://dunning.invalid/problems/"


@pytest.fixture(autouse=True)
def webhook_settings(settings):
    settings.STRIPE_WEBHOOK_SECRETS = [SECRET]
    settings.STRIPE_ACCOUNT = "acct_demo"


@pytest.fixture
def lead(db):
    return make_staff("lead", LEADS)


@pytest.fixture
def lead_client(lead):
    return session_client(lead)


@pytest.fixture
def admin_client(lead):
    client = Client(raise_request_exception=False)
    client.force_login(lead)
    return client


@pytest.fixture
def grace_cycle(policy):
    cycle = open_cycle(make_subscription())
    fail_first_payment(cycle)
    return cycle


def post_webhook(client, body: bytes, **headers):
    return client.post("/webhooks/stripe/", data=body, content_type="application/json",
                       HTTP_STRIPE_SIGNATURE=stripe_signature(body, SECRET), **headers)


def assert_kept_as_rejected(response, body: bytes, *, code: str, mentions: str) -> WebhookDelivery:
    assert response.status_code == 400, response.content
    assert response["Content-Type"] == "application/problem+json"
    problem = response.json()
    assert problem["code"] == code and problem["type"] == PROBLEM_BASE + f"webhook-{code.lower().replace('_', '-')}"
    assert mentions in problem["detail"], problem
    delivery = WebhookDelivery.objects.get()
    assert (delivery.verification, delivery.rejection_reason, delivery.http_status) == ("REJECTED", code, 400)
    assert bytes(delivery.body) == body, "the raw request is kept exactly as received"
    assert NUL not in delivery.detail and mentions in delivery.detail
    assert not ProviderEvent.objects.exists()
    return delivery


# --- the signed webhook ----------------------------------------------------------------------------


@pytest.mark.parametrize("field,event,mentions", [
    ("id", {"event_id": f"evt_{NUL}x"}, "id"),
    ("type", {"event_type": f"invoice.{NUL}paid"}, "type"),
    ("account", {"account": f"acct_{NUL}"}, "account"),
    ("api_version", {"api_version": f"2026-10-28{NUL}"}, "api_version"),
    ("data.object.id", {"obj": {"id": f"in_{NUL}1", "object": "invoice"}}, "data.object.id"),
    ("another object id", {"obj": {"id": "in_1", "object": "invoice", "subscription": f"sub_{NUL}"}},
     "data.object.subscription"),
    ("a key", {"obj": {"id": "in_1", "object": "invoice", "metadata": {f"k{NUL}": "v"}}}, "data.object.metadata"),
])
def test_a_signed_event_with_a_nul_in_any_field_is_400_and_its_delivery_kept(db, client, field, event, mentions):
    body = event_body(**{"event_id": "evt_nul", **event})
    assert b"\\u0000" in body and NUL.encode() not in body
    assert_kept_as_rejected(post_webhook(client, body), body, code="MALFORMED_EVENT", mentions=mentions)


@pytest.mark.parametrize("field,length,column", [
    ("id", 300, 255), ("type", 200, 128), ("api_version", 40, 32), ("account", 300, 255),
])
def test_a_signed_event_with_an_over_long_field_is_400_and_its_delivery_kept(db, client, field, length, column):
    overrides = {"id": {"event_id": "e" * length}, "type": {"event_type": "invoice." + "p" * (length - 8)},
                 "api_version": {"api_version": "v" * length}, "account": {"account": "a" * length}}[field]
    body = event_body(**{"event_id": "evt_long", **overrides})
    assert_kept_as_rejected(post_webhook(client, body), body, code="MALFORMED_EVENT",
                            mentions=f"{field} is {length} characters long; at most {column}")


@pytest.mark.parametrize("case,body,code,mentions", [
    ("NaN", b'{"id": "evt_nan", "type": "invoice.paid", "data": {"object": {"id": "in_1", "total": NaN}}}',
     "MALFORMED_EVENT", "data.object.total"),
    ("lone surrogate", b'{"id": "evt_\\ud800", "type": "invoice.paid", "data": {"object": {"id": "in_1"}}}',
     "MALFORMED_EVENT", "lone surrogate"),
    ("created out of range", event_body("evt_created", created=10**20), "MALFORMED_EVENT", "created"),
    ("nested too deeply", b"[" * 50_000 + b"]" * 50_000, "MALFORMED_PAYLOAD", "nested too deeply"),
])
def test_a_signed_body_postgresql_or_python_cannot_hold_is_400_and_kept(db, client, case, body, code, mentions):
    assert_kept_as_rejected(post_webhook(client, body), body, code=code, mentions=mentions)


def test_a_nul_in_a_kept_header_is_stored_escaped_and_the_event_accepted(db, client):
    body = event_body("evt_header", "customer.created")
    response = post_webhook(client, body, HTTP_USER_AGENT=f"Stripe/1.0{NUL}evil")
    assert response.status_code == 200, response.content
    delivery = WebhookDelivery.objects.get()
    assert delivery.verification == "VERIFIED" and delivery.event.event_id == "evt_header"
    assert delivery.headers["User-Agent"] == "Stripe/1.0\\u0000evil"


def test_a_rejected_delivery_with_a_nul_in_its_signature_header_is_kept_escaped(db, client):
    body = event_body("evt_sig")
    response = client.post("/webhooks/stripe/", data=body, content_type="application/json",
                           HTTP_STRIPE_SIGNATURE=f"t=1,v1={NUL}")
    assert response.status_code == 400
    delivery = WebhookDelivery.objects.get()
    assert delivery.verification == "REJECTED" and delivery.headers["Stripe-Signature"] == "t=1,v1=\\u0000"


# --- the REST API ------------------------------------------------------------------------------------


@pytest.mark.parametrize("method,path", [
    ("get", "/api/v1/subscriptions/sub_%00x/entitlement"),
    ("get", "/api/v1/subscriptions/sub_%00x"),
    ("get", "/api/v1/cycles/%00"),
    ("get", "/api/v1/cycles/%00/transitions"),
    ("get", "/api/v1/policies?cursor=%00"),
    ("post", "/api/v1/cycles/%00/retry"),
    ("post", "/api/v1/cycles/%00/exception"),
])
def test_a_nul_in_an_api_path_or_query_is_a_400_problem_document(lead_client, grace_cycle, method, path):
    response = getattr(lead_client, method)(path, {"reason": "r", "ticket": "T"} if method == "post" else None,
                                            format="json", HTTP_IDEMPOTENCY_KEY="nul-path")
    assert response.status_code == 400
    assert response["Content-Type"] == "application/problem+json"
    problem = response.json()
    assert problem["type"] == PROBLEM_BASE + "nul-character" and problem["status"] == 400
    assert "NUL" in problem["detail"]
    assert not IdempotencyRecord.objects.exists()


def test_a_nul_in_an_api_id_is_404_even_below_the_guard(rf, lead):
    """The selector refuses an id no column can hold without asking the database, should a caller
    reach it some other way than through the request guard."""
    from django.http import Http404

    from entitlements.api.selectors import subscription_for_request

    request = rf.get("/")
    request.user = lead
    with pytest.raises(Http404):
        subscription_for_request(request, f"sub_{NUL}x")


@pytest.mark.parametrize("key,fault", [
    (f"key-{NUL}-1", "outside visible ASCII"),
    ("k" * 10_000, "10000 characters long"),
])
def test_a_nul_or_10kb_idempotency_key_is_a_clear_400(lead_client, grace_cycle, key, fault):
    response = lead_client.post(f"/api/v1/cycles/{grace_cycle.pk}/exception",
                                {"expires_at": (trusted_now() + timedelta(days=2)).isoformat(), "reason": "r",
                                 "ticket": "T"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert response.status_code == 400
    problem = response.json()
    assert problem["type"] == PROBLEM_BASE + "idempotency-key-invalid"
    assert fault in problem["detail"] and problem["errors"][0]["field"] == "Idempotency-Key"
    assert not IdempotencyRecord.objects.exists()
    assert not TransitionReceipt.objects.filter(cycle=grace_cycle, edge="grant_exception").exists()


def _policy_text(fmt: str, **overrides) -> str:
    doc = policy_document(**overrides)
    return json.dumps(doc) if fmt == "json" else yaml.safe_dump(doc)


@pytest.mark.parametrize("fmt", ["json", "yaml"])
@pytest.mark.parametrize("case,overrides,mentions", [
    ("nul in a price", {"applies_to": {"prices": [f"price_{NUL}"], "cohort": "default"}},
     "applies_to.prices[0] contains a NUL"),
    ("nul in the cohort", {"applies_to": {"prices": ["p"], "cohort": f"c{NUL}"}}, "applies_to.cohort contains a NUL"),
    ("nul in a key", {"failure_classes": {f"x{NUL}": "RETRYABLE"}}, "a key under failure_classes contains a NUL"),
    ("nul in the account", {"provider": {"name": "stripe", "account": f"acct_{NUL}"}}, "provider.account"),
    ("cohort too long", {"applies_to": {"prices": ["p"], "cohort": "c" * 100}}, "cohort is 100 characters long"),
    ("name too long", {"policy": "p" * 200 + "@1"}, "name is 200 characters long; at most 128"),
    ("version too large", {"policy": "p-big@99999999999"}, "version 99999999999 is above the largest version"),
])
def test_a_policy_document_that_the_columns_cannot_hold_is_422(lead_client, db, fmt, case, overrides, mentions):
    text = _policy_text(fmt, **overrides)
    assert NUL not in text, "the NUL is escaped in the text (\\u0000 in JSON, \\0 in YAML): the text itself is valid"
    response = lead_client.post("/api/v1/policies", {"text": text}, format="json", HTTP_IDEMPOTENCY_KEY=f"{fmt}-doc")
    assert response.status_code == 422, response.content
    problem = response.json()
    assert problem["type"] == PROBLEM_BASE + "policy-invalid" and mentions in problem["detail"], problem
    assert not DunningPolicy.objects.exists()


def test_publish_policy_refuses_a_nul_in_the_text_itself(db):
    from dunning.policy.document import PolicyValidationError
    from dunning.policy.publishing import policy_publish

    with pytest.raises(PolicyValidationError, match="document contains a NUL"):
        policy_publish(text=_policy_text("yaml") + f"# comment {NUL}\n")
    assert not DunningPolicy.objects.exists()


# --- the admin and the session --------------------------------------------------------------------------


def assert_plain(response, status: int, mentions: str) -> None:
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"].startswith("text/plain")
    assert mentions in response.content.decode()


@pytest.mark.parametrize("url", [
    "/admin/dunning/dunningcycle/?q=sub_%00",
    "/admin/subscriptions/subscription/?q=%00",
    "/admin/dunning/providerevent/?q=evt_%00x",
    "/admin/dunning/dunningcycle/?state=%00",
    "/admin/dunning/providerevent/?event_type__exact=%00",
    "/admin/dunning/webhookdelivery/?rejection_reason=%00",
    "/admin/subscriptions/subscription/?cycle_state=%00",
    "/admin/dunning/dunningcycle/%00/change/",
    "/admin/autocomplete/?term=%00&app_label=dunning&model_name=dunningcycle&field_name=subscription",
])
def test_a_nul_in_an_admin_search_filter_or_id_is_a_plain_400(admin_client, url):
    assert_plain(admin_client.get(url), 400, "contains a NUL character")


@pytest.mark.parametrize("path,mentions", [
    ("/admin/subscriptions/subscription/{sub}x/change/", "no subscription has the id"),
    ("/admin/subscriptions/subscription/" + "x" * 300 + "/change/", "no subscription has the id"),
    ("/admin/dunning/dunningcycle/{cycle}/history/abc/", "no past version of a dunning cycle"),
])
def test_an_admin_id_no_row_can_have_is_a_plain_404(admin_client, grace_cycle, path, mentions):
    url = path.format(sub=grace_cycle.subscription_id, cycle=grace_cycle.pk)
    assert_plain(admin_client.get(url), 404, mentions)


@pytest.mark.parametrize("selected", [NUL, "abc"])
def test_an_admin_action_on_a_selection_that_is_no_id_is_a_plain_400(admin_client, selected):
    response = admin_client.post("/admin/dunning/alert/", {"action": "acknowledge_selected", "index": "0",
                                                           "_selected_action": [selected]})
    assert_plain(response, 400, "no alert has as its id")


def test_a_nul_in_the_session_cookie_is_a_400_not_a_session_lookup(db, settings):
    client = Client(raise_request_exception=False)
    client.cookies[settings.SESSION_COOKIE_NAME] = f"abcdefgh{NUL}ijkl"
    assert_plain(client.get("/billing/"), 400, "session cookie contains a NUL")
    api = client.get("/api/v1/policies")
    assert api.status_code == 400 and api.json()["type"] == PROBLEM_BASE + "nul-character"
