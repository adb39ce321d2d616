"""The Stripe SDK's HTTP client replaced by a direct call into the simulator's API handler:
the same request parsing, faults, idempotency records and rendering as over loopback HTTP,
without a socket per request. A ``timeout`` fault (the connection hangs, then drops) becomes
the error the SDK's own client raises on a timeout, at once instead of after a real wait."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import stripe

from tests.verification.fake_stripe.api import Request, StripeApi


class InProcessClient(stripe.RequestsClient):
    name = "simulation-in-process"

    def __init__(self, api: StripeApi, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.api = api

    def request(self, method: str, url: str, headers: Mapping[str, str] | None, post_data: Any = None
                ) -> tuple[bytes, int, Mapping[str, str]]:
        parts = urlsplit(url)
        body = post_data.encode() if isinstance(post_data, str) else (post_data or b"")
        request = Request(method.upper(), parts.path, parts.query, body,
                          {k.lower(): v for k, v in (headers or {}).items()})
        response = self.api.handle(request)
        if response.hang is not None:
            raise stripe.APIConnectionError(
                "Request timed out (simulated: the connection hung and was closed without an answer)")
        return response.body, response.status, response.headers


def client_factory(api: StripeApi) -> Any:
    """Stands in for ``stripe.RequestsClient`` while a simulation runs."""

    def make(*args: Any, **kwargs: Any) -> InProcessClient:
        kwargs.pop("timeout", None)
        return InProcessClient(api)

    return make
