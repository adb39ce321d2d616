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

A plain GET (every fetch: the grace sweep's, each paid event's) without a proxy goes from the
session straight to the adapter's urllib3 pool, with the body read in one go
(`_ApiSession.request`). `Session.request` built a Request, merged cookies, hooks, headers and
settings into a PreparedRequest and re-parsed its URL, then `Response.content` read the body in
10 KB chunks through a generator: about a quarter of a fetch's CPU (1.37-1.41 -> 0.98-1.17 ms per
fetch through the adapter, instant simulator). The connection pool, its TLS settings (the SDK's CA
bundle, `verify`), the timeout and the exceptions are requests' own, so the SDK sees the same
answers and the same errors. Writes, streams and proxied requests take requests' whole path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import requests
import stripe
from requests.adapters import HTTPAdapter
from requests.exceptions import (
    ConnectionError,  # noqa: A004 - requests' own, as HTTPAdapter.send raises it
    ConnectTimeout,
    ContentDecodingError,
    InvalidHeader,
    ProxyError,
    ReadTimeout,
    RetryError,
    SSLError,
)
from requests.structures import CaseInsensitiveDict
from urllib3 import Timeout
from urllib3.exceptions import (
    ClosedPoolError,
    ConnectTimeoutError,
    DecodeError,
    MaxRetryError,
    NewConnectionError,
    ProtocolError,
    ReadTimeoutError,
    ResponseError,
)
from urllib3.exceptions import InvalidHeader as _InvalidHeader
from urllib3.exceptions import ProxyError as _ProxyError
from urllib3.exceptions import SSLError as _SSLError


class _Answer:
    """What RequestsClient reads of a response: its body, status and headers (case-insensitive)."""

    __slots__ = ("content", "headers", "status_code")

    def __init__(self, content: bytes, status_code: int, headers: Mapping[str, str]) -> None:
        self.content, self.status_code, self.headers = content, status_code, headers


class _ApiSession(requests.Session):
    """A session as RequestsClient uses it, with a short path for a plain GET (see the module)."""

    def request(self, method: str, url: str, headers: Mapping[str, str] | None = None,  # type: ignore[override]
                data: Any = None, timeout: Any = None, verify: Any = True, **other: Any) -> Any:
        if other or data or method.upper() != "GET" or self.proxies or not isinstance(url, str):
            return super().request(method, url, headers=headers, data=data, timeout=timeout, verify=verify, **other)
        return self._get(url, headers, timeout, verify)

    def _get(self, url: str, headers: Mapping[str, str] | None, timeout: Any, verify: Any) -> _Answer:
        adapter = self.get_adapter(url)
        if type(adapter) is not HTTPAdapter:  # a mounted adapter of someone else's: requests' own path
            return super().request("GET", url, headers=headers, timeout=timeout, verify=verify)
        request = requests.PreparedRequest()
        request.method, request.url = "GET", url
        request.headers = CaseInsensitiveDict(self.headers)  # requests' defaults (Accept-Encoding, ...)
        request.headers.update(headers or {})
        connect, read = timeout if isinstance(timeout, tuple) else (timeout, timeout)
        try:
            pool = adapter.get_connection_with_tls_context(request, verify, proxies=None, cert=None)
            adapter.cert_verify(pool, url, verify, None)
            answer = pool.urlopen(method="GET", url=request.path_url, body=None, headers=request.headers,
                                  redirect=False, assert_same_host=False, preload_content=True, decode_content=True,
                                  retries=adapter.max_retries, timeout=Timeout(connect=connect, read=read))
        # The exceptions HTTPAdapter.send (and Response.content, for the body) raise for the same failures.
        except (ProtocolError, OSError) as err:
            raise ConnectionError(err, request=request) from err
        except MaxRetryError as err:
            reason = err.reason
            if isinstance(reason, ConnectTimeoutError) and not isinstance(reason, NewConnectionError):
                raise ConnectTimeout(err, request=request) from err
            if isinstance(reason, ResponseError):
                raise RetryError(err, request=request) from err
            if isinstance(reason, _ProxyError):
                raise ProxyError(err, request=request) from err
            if isinstance(reason, _SSLError):
                raise SSLError(err, request=request) from err
            raise ConnectionError(err, request=request) from err
        except ClosedPoolError as err:
            raise ConnectionError(err, request=request) from err
        except _SSLError as err:
            raise SSLError(err, request=request) from err
        except ReadTimeoutError as err:
            raise ReadTimeout(err, request=request) from err
        except DecodeError as err:
            raise ContentDecodingError(err) from err
        except _InvalidHeader as err:
            raise InvalidHeader(err, request=request) from err
        return _Answer(answer.data, answer.status, answer.headers)


class _RequestsReadingTheEnvironmentOnce:
    """`requests` as RequestsClient uses it; `Session()` gives a session configured as above."""

    def __init__(self, api_base: str) -> None:
        self.proxies = requests.utils.get_environ_proxies(api_base)

    def __getattr__(self, name: str) -> Any:
        return getattr(requests, name)

    def Session(self) -> requests.Session:  # noqa: N802 - the name RequestsClient calls
        session = _ApiSession()
        session.trust_env = False
        session.proxies.update(self.proxies)
        return session


def stripe_http_client(*, api_base: str, timeout: float) -> stripe.RequestsClient:
    """One per adapter; RequestsClient still keeps one session per thread."""
    return stripe.RequestsClient(timeout=timeout, _lib=_RequestsReadingTheEnvironmentOnce(api_base))
