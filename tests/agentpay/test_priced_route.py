"""A priced call goes past the session, CSRF, auth, messages and history middleware
(agentpay.api.priced_route.PricedCallRoute) and is answered exactly as through the whole chain:
the same status, problem and security headers for a paid call and for every refusal. Every other
URL keeps the whole chain."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.sessions.middleware import SessionMiddleware
from django.test import Client

from agentpay.api.priced_route import ME, SKIPPED
from agentpay.models import GatewayRequest

pytestmark = pytest.mark.django_db

HEADERS = ("X-Frame-Options", "X-Content-Type-Options", "Referrer-Policy", "Cross-Origin-Opener-Policy", "Allow",
           "Content-Type", "AgentPay-Display-Status")


def _requests(api_key: str, tag: str) -> list[tuple[str, str, dict[str, Any]]]:
    auth = {"HTTP_AUTHORIZATION": f"Bearer {api_key}", "content_type": "application/json"}
    return [
        ("paid", "/agentpay/v1/routes/ok/run", {**auth, "HTTP_IDEMPOTENCY_KEY": f"{tag}-paid"}),
        ("upstream 4xx", "/agentpay/v1/routes/bad/run", {**auth, "HTTP_IDEMPOTENCY_KEY": f"{tag}-bad"}),
        ("bad host", "/agentpay/v1/routes/ok/run", {**auth, "HTTP_IDEMPOTENCY_KEY": f"{tag}-host",
                                                     "HTTP_HOST": "evil.example"}),
        ("NUL in the query", "/agentpay/v1/routes/ok/run?q=%00", {**auth, "HTTP_IDEMPOTENCY_KEY": f"{tag}-nul"}),
        ("unknown route", "/agentpay/v1/routes/nope/run", {**auth, "HTTP_IDEMPOTENCY_KEY": f"{tag}-nope"}),
        ("no key", "/agentpay/v1/routes/ok/run", auth),
        ("bad API key", "/agentpay/v1/routes/ok/run", {**auth, "HTTP_AUTHORIZATION": "Bearer ak_nope",
                                                       "HTTP_IDEMPOTENCY_KEY": f"{tag}-who"}),
        ("GET on a POST route", "/agentpay/v1/routes/ok/run", {**auth, "HTTP_IDEMPOTENCY_KEY": f"{tag}-get",
                                                               "method": "get"}),
        ("no route at all", "/agentpay/v1/routes/", auth),
    ]


def _answers(api_key: str, tag: str) -> dict[str, tuple[int, str, dict[str, str]]]:
    client = Client()  # a fresh handler: it builds its chain from settings.MIDDLEWARE as they are now
    answers = {}
    for name, url, extra in _requests(api_key, tag):
        method = extra.pop("method", "post")
        response = client.get(url, **extra) if method == "get" else client.post(url, data=b'{"q": 1}', **extra)
        problem = response.json().get("type", "") if response["Content-Type"].endswith("json") else ""
        answers[name] = (response.status_code, problem, {h: response.get(h) for h in HEADERS})
    return answers


def test_every_answer_is_the_whole_chains(funded, routes, api_key, settings):
    through_the_route = _answers(api_key, "route")
    assert through_the_route["paid"][0] == 200 and through_the_route["bad host"][0] == 400
    assert through_the_route["NUL in the query"][0] == 400 and through_the_route["unknown route"][0] == 404
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if m != ME]
    assert through_the_route == _answers(api_key, "chain")
    # Each request was recorded both ways, refusals too (the request log comes first).
    assert GatewayRequest.objects.filter(idempotency_key__startswith="route-").count() == 7


def test_a_priced_call_skips_the_browsers_middleware_and_nothing_else_does(funded, routes, api_key, monkeypatch):
    ran: list[str] = []
    for name, cls in (("session", SessionMiddleware), ("messages", MessageMiddleware)):
        def recorded(self, request, name=name, original=cls.process_request):
            ran.append(name)
            return original(self, request)

        monkeypatch.setattr(cls, "process_request", recorded)
    client = Client()
    auth = {"HTTP_AUTHORIZATION": f"Bearer {api_key}"}
    paid = client.post("/agentpay/v1/routes/ok/run", data=b"{}", content_type="application/json",
                       HTTP_IDEMPOTENCY_KEY="skip-1", **auth)
    assert paid.status_code == 200 and ran == []
    assert paid.resolver_match.url_name == "route-call" and paid.headers["X-Frame-Options"] == "DENY"
    read = client.get(f"/agentpay/v1/intents/{paid['AgentPay-Intent']}", **auth)
    assert read.status_code == 200 and ran == ["session", "messages"]  # the intent read: the whole chain


def test_the_route_sits_after_the_request_log_and_skips_only_what_a_key_never_uses():
    log = settings.MIDDLEWARE.index("agentpay.api.request_log.GatewayRequestLog")
    assert settings.MIDDLEWARE.index(ME) == log + 1
    assert set(settings.MIDDLEWARE) > SKIPPED  # each one it skips is one the chain has
    assert "django.middleware.security.SecurityMiddleware" not in SKIPPED
