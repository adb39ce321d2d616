"""The HTTP client the Stripe adapter gives the SDK: stripe's RequestsClient, whose sessions read
the environment's proxy settings once instead of on every request.

A `requests.Session` trusts the environment by default (`trust_env`): on every request it walks
every environment variable for `*_proxy`, asks whether the host bypasses them, looks up
REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE and searches for a .netrc. For one `GET /v1/invoices/{id}`
that was 1.36 s of the SDK's 3.9 s of CPU over 300 fetches (cProfile timed by process CPU, one
grace sweep thread), the largest part of a fresh fetch's own cost, on every sweep cycle and paid
event. Here each session is made with `trust_env` off and the proxies the environment names for
the API's address, read when the adapter is built (so a proxy still applies; the variables do not
change under a running process). The CA bundle the environment could name never applied: the SDK
passes its own with every request (`verify=stripe.ca_bundle_path`). A .netrc entry for the API
host is no longer looked up: the SDK authenticates with its own Authorization header, which such
an entry would have replaced.

stripe==16.1.0's RequestsClient makes its per-thread sessions with `self.requests.Session()`
(its `_lib` argument); everything else it takes from `requests` itself.
"""

from __future__ import annotations

from typing import Any

import requests
import stripe


class _RequestsReadingTheEnvironmentOnce:
    """`requests` as RequestsClient uses it; `Session()` gives a session configured as above."""

    def __init__(self, api_base: str) -> None:
        self.proxies = requests.utils.get_environ_proxies(api_base)

    def __getattr__(self, name: str) -> Any:
        return getattr(requests, name)

    def Session(self) -> requests.Session:  # noqa: N802 - the name RequestsClient calls
        session = requests.Session()
        session.trust_env = False
        session.proxies.update(self.proxies)
        return session


def stripe_http_client(*, api_base: str, timeout: float) -> stripe.RequestsClient:
    """One per adapter; RequestsClient still keeps one session per thread."""
    return stripe.RequestsClient(timeout=timeout, _lib=_RequestsReadingTheEnvironmentOnce(api_base))
