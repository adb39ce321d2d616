"""The OpenAPI schema is published, the docs page renders offline, and Schemathesis finds no
5xx and no response outside the schema (run in process through the WSGI app, as a billing
lead with a session and CSRF token, so reads and writes are both exercised)."""

from __future__ import annotations

import itertools

import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.test import Client
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

CSRF = "a" * 32
_alternate = itertools.cycle([True, False])
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def test_the_schema_is_published_and_lists_every_endpoint(client, db):
    response = client.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    assert set(paths) == {
        "/api/v1/subscriptions/{ref}/entitlement", "/api/v1/subscriptions/{ref}", "/api/v1/cycles/{ref}",
        "/api/v1/cycles/{ref}/transitions", "/api/v1/cycles/{ref}/exception", "/api/v1/cycles/{ref}/retry",
        "/api/v1/policies", "/api/v1/events/{event_id}/reprocess", "/api/v1/alerts",
        "/api/v1/alerts/{alert_id}/acknowledge", "/api/v1/alerts/{alert_id}/resolve",
        "/api/v1/usage-records/", "/api/v1/usage-records/batch/", "/api/v1/subscriptions/{ref}/usage/",
        "/api/v1/subscriptions/{ref}/usage/export.csv", "/api/v1/subscriptions/{ref}/usage/export.json",
    }
    assert "serviceToken" in response.json()["components"]["securitySchemes"]


def test_the_docs_page_renders_with_bundled_assets(client, db):
    response = client.get("/api/docs/")
    assert response.status_code == 200
    assert b"swagger-ui" in response.content and b"drf_spectacular_sidecar" in response.content


@pytest.fixture
def api_schema(db, lead, grace_cycle):
    # The WSGI handler would close the test's connection after each request; the test client
    # avoids that the same way.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield schemathesis.openapi.from_wsgi("/api/schema/", WSGIHandler())
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def lead_session(lead):
    client = Client()
    client.force_login(lead)
    return {"cookies": {"sessionid": client.cookies["sessionid"].value, "csrftoken": CSRF},
            "headers": {"X-CSRFToken": CSRF, "Authorization": ""}}  # no generated Bearer token


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=10, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.filter_too_much])
def test_no_server_errors_and_no_response_outside_the_schema(case, lead_session, grace_cycle):
    # Every other case names an existing subscription or cycle, so the handlers run past the 404.
    if "ref" in (case.path_parameters or {}) and next(_alternate):
        is_cycle = "/cycles/" in case.path
        case.path_parameters["ref"] = str(grace_cycle.cycle_id if is_cycle else grace_cycle.subscription.pk)
    case.call_and_validate(**lead_session, checks=CHECKS)
