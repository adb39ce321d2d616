"""The SDK's HTTP client (subscriptions.providers.stripe_http): sessions that take the
environment's proxies for the API's address once, when the adapter is built, and do not read the
environment again on each request; a fetch through them still reaches the provider."""

from __future__ import annotations

import http.server
import os
import threading

import pytest
import requests

from subscriptions.providers.stripe_http import stripe_http_client
from tests.providers.test_invoice_fetch import provider, sim  # noqa: F401 - the simulator fixture

API = "https://api.stripe.com"


@pytest.fixture
def no_proxy_environment(monkeypatch):
    for name in list(os.environ):
        if name.lower().endswith("_proxy"):
            monkeypatch.delenv(name)
    return monkeypatch


def _session(api_base: str = API) -> requests.Session:
    return stripe_http_client(api_base=api_base, timeout=5.0).requests.Session()


def test_the_environment_s_proxy_is_taken_when_the_client_is_built(no_proxy_environment):
    no_proxy_environment.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    session = _session()
    assert not session.trust_env and session.proxies["https"] == "http://proxy.internal:3128"
    no_proxy_environment.setenv("NO_PROXY", "api.stripe.com")
    assert "https" not in _session().proxies  # the API's host bypasses it


def test_a_request_does_not_read_the_environment_again(no_proxy_environment):
    session = _session()
    no_proxy_environment.setenv("HTTPS_PROXY", "http://proxy.internal:3128")  # set after the client was built
    settings = session.merge_environment_settings(f"{API}/v1/invoices/in_1", {}, False, True, None)
    assert "https" not in settings["proxies"]
    assert "https" in requests.Session().merge_environment_settings(f"{API}/v1/invoices/in_1", {}, False, True,
                                                                    None)["proxies"], "a default session would"


def test_a_fetch_goes_through_the_client_s_sessions(sim, monkeypatch):  # noqa: F811
    made: list[requests.Session] = []
    adapter = provider(sim)
    lib = adapter._client._requestor._client.requests
    make = type(lib).Session
    monkeypatch.setattr(type(lib), "Session", lambda self: made.append(make(self)) or made[-1])
    customer = sim.create_customer("ada@example.com", card="stolen_card")
    invoice_id = sim.create_renewal_invoice(sim.create_subscription(customer, "price_monthly_pro", amount=2500))
    assert adapter.fetch_invoice(invoice_id).id == invoice_id
    assert len(made) == 1 and not made[0].trust_env


def test_a_fetch_takes_the_short_path_and_reads_the_same_invoice(sim, monkeypatch):  # noqa: F811
    """A plain GET skips Session.request's preparation (fails if it goes through prepare_request)."""
    adapter = provider(sim)
    customer = sim.create_customer("ada@example.com", card="stolen_card")
    invoice_id = sim.create_renewal_invoice(sim.create_subscription(customer, "price_monthly_pro", amount=2500))
    through_requests = adapter.fetch_invoice(invoice_id)  # the first call, then the session exists
    prepared: list[str] = []
    real = requests.Session.prepare_request
    monkeypatch.setattr(requests.Session, "prepare_request", lambda self, r: prepared.append(r.url) or real(self, r))
    fetched = adapter.fetch_invoice(invoice_id)
    assert prepared == []
    assert fetched.raw == through_requests.raw and fetched.id == invoice_id and fetched.status == "open"


def test_the_short_path_answers_as_requests_does():
    """Status, body and case-insensitive headers of an error answer, and a refused connection
    raised as the ConnectionError requests raises (what the SDK turns into APIConnectionError)."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = b'{"error": {"type": "invalid_request_error", "message": "No such invoice"}}'
            self.send_response(404)
            self.send_header("Request-Id", "req_1")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/v1/invoices/in_x?expand%5B0%5D=payments"
    try:
        lean = _session(f"http://127.0.0.1:{server.server_port}").request("get", url, headers={"X-A": "1"}, timeout=5)
        plain = requests.Session().request("get", url, headers={"X-A": "1"}, timeout=5)
        assert type(lean) is not requests.Response  # the short path answered
        assert (lean.status_code, lean.content) == (plain.status_code, plain.content)
        assert lean.headers["request-id"] == plain.headers["Request-Id"] == "req_1"
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(requests.exceptions.ConnectionError):
        _session().request("get", url, timeout=2)  # nothing listens there any more


def test_a_proxied_or_non_get_request_takes_requests_whole_path(no_proxy_environment, monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(requests.Session, "request", lambda self, method, url, **kw: calls.append(method) or "full")
    no_proxy_environment.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    assert _session().request("get", f"{API}/v1/invoices/in_1", timeout=1) == "full"
    no_proxy_environment.delenv("HTTPS_PROXY")
    assert _session().request("post", f"{API}/v1/invoices/in_1/pay", data="a=1", timeout=1) == "full"
    assert calls == ["get", "post"]
