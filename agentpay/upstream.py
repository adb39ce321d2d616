"""HTTP to the upstream APIs: the forwarded call and the idempotent status query.

Only plain functions that return what happened; they never run inside a transaction (the
caller commits `dispatch` first). The fulfillment id is the upstream's Idempotency-Key, so
the status query can ask about exactly this call.

Status query contract (the upstream implements it; wallet-ledger-spec §9.3):
`GET <status_query_url>/<ful_id>` answers 200 with {"status": "succeeded" | "failed" |
"not_found" | "in_progress", "fenced": bool}. "succeeded", "failed" and a fenced "not_found" on a
route that declares `fences_not_found` move the fulfillment; anything else leaves it unknown.
"""

from __future__ import annotations

import hashlib
import http.client
import ipaddress
import json
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from django.conf import settings

from agentpay.models import PricedRoute

# What we pass on from the agent's request, and back from the upstream's answer.
FORWARDED_ANSWER_HEADERS = ("content-type",)


@dataclass(frozen=True)
class UpstreamAnswer:
    outcome: str  # "2xx" | "4xx" | "5xx" (not proven either way) | "timeout" (no complete answer)
    status: int | None = None
    body: bytes = b""
    content_type: str = ""
    error: str = ""


def _connection(url: str, connect_timeout: float) -> tuple[http.client.HTTPConnection, str]:
    parts = urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    return cls(parts.hostname, parts.port, timeout=connect_timeout), target


def upstream_url(route: PricedRoute, path: str, query: str) -> str:
    base = route.upstream_base_url.rstrip("/") + "/" + route.upstream_path.strip("/")
    url = base.rstrip("/") + ("/" + quote(path.lstrip("/"), safe="/") if path else "")
    return url + (f"?{query}" if query else "")


def upstream_forward(*, route: PricedRoute, fulfillment_id: str, request_id: uuid.UUID, path: str, query: str,
                     content_type: str, body: bytes) -> UpstreamAnswer:
    conn, target = _connection(upstream_url(route, path, query), route.connect_timeout_seconds)
    headers = {"Idempotency-Key": fulfillment_id, "X-Request-Id": str(request_id)}
    if content_type:
        headers["Content-Type"] = content_type
    try:
        conn.connect()
        conn.sock.settimeout(route.read_timeout_seconds)
        conn.request(route.method, target, body=body or None, headers=headers)
        response = conn.getresponse()
        data = response.read()  # an answer cut short raises IncompleteRead: not a complete 2xx
    except TimeoutError as exc:
        return UpstreamAnswer("timeout", error=f"timed out: {exc}")
    except (http.client.HTTPException, OSError) as exc:
        # Refused, reset, or dropped mid-answer: we cannot know whether the upstream acted.
        return UpstreamAnswer("timeout", error=f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()
    status = response.status
    outcome = "2xx" if 200 <= status < 300 else "4xx" if 400 <= status < 500 else "5xx"
    return UpstreamAnswer(outcome, status=status, body=data, content_type=response.getheader("Content-Type", ""))


@dataclass(frozen=True)
class StatusAnswer:
    """The upstream's word on one fulfillment: succeeded, failed, not_found, in_progress, or
    `error: …` when it did not answer the contract; `fenced` for a not_found that fences the key.
    The rest is what the evidence row keeps (wallet-ledger-spec §9.3): the HTTP status, how long
    it took, a digest of the body, why it was inconclusive, and the request id we sent."""

    answer: str
    fenced: bool = False
    http_status: int | None = None
    latency_ms: int | None = None
    body_digest: str = ""
    error: str = ""
    timed_out: bool = False
    request_id: uuid.UUID | None = None

    @property
    def conclusive(self) -> bool:
        return not self.answer.startswith("error")


def upstream_status_query(*, route: PricedRoute, fulfillment_id: str,
                          request_id: uuid.UUID | None = None) -> StatusAnswer:
    """GET <status_query_url>/<ful_id> (wallet-ledger-spec §9.3), with `AgentPay-Request-Id`."""
    request_id = request_id or uuid.uuid4()

    def inconclusive(error: str, **seen: Any) -> StatusAnswer:
        return StatusAnswer(f"error: {error}"[:200], error=error, request_id=request_id, **seen)

    if not route.status_query_url:
        return inconclusive("the route has no status query URL")
    url = route.status_query_url.rstrip("/") + "/" + quote(fulfillment_id)
    conn, target = _connection(url, settings.AGENTPAY_STATUS_QUERY_TIMEOUT_SECONDS)
    started = time.monotonic()
    try:
        conn.request("GET", target, headers={"Accept": "application/json", "AgentPay-Request-Id": str(request_id)})
        response = conn.getresponse()
        data = response.read()
    except TimeoutError as exc:
        return inconclusive(f"timed out: {exc}", timed_out=True, latency_ms=_since(started))
    except (http.client.HTTPException, OSError) as exc:
        return inconclusive(f"{type(exc).__name__}: {exc}", latency_ms=_since(started))
    finally:
        conn.close()
    seen: dict[str, Any] = {"http_status": response.status, "latency_ms": _since(started),
                            "body_digest": hashlib.sha256(data).hexdigest()}
    if response.status != 200:  # only a 200 counts (§9.3); a 404 page is not "not found"
        return inconclusive(f"HTTP {response.status}", **seen)
    try:
        body = json.loads(data)
        status = body["status"]
    except (ValueError, KeyError, TypeError):
        return inconclusive("not the status contract", **seen)
    if body.get("fulfillment_id", fulfillment_id) != fulfillment_id:
        return inconclusive(f"the answer is about {str(body.get('fulfillment_id'))[:64]}", **seen)
    if status not in ("succeeded", "failed", "not_found", "in_progress"):
        return inconclusive(f"status {str(status)[:40]!r}", **seen)
    return StatusAnswer(status, fenced=status == "not_found" and body.get("fenced") is True, request_id=request_id,
                        **seen)


def _since(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


@dataclass(frozen=True)
class CallbackAnswer:
    status: int | None
    latency_ms: int
    error: str = ""


def non_public_address(address: str) -> bool:
    """Loopback, private, link-local (cloud metadata at 169.254.169.254), multicast, reserved or
    unspecified: an address a tenant's callback must not make us reach inside our network."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return not ip.is_global or ip.is_multicast


def callback_host_problem(url: str) -> str:
    """Why `url`'s host must not receive callbacks ('' when every address it resolves to is
    public). Resolving here and checking the connected peer again in `callback_post` closes the
    DNS-rebinding gap between the check and the POST."""
    host = urlsplit(url).hostname or ""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError) as exc:
        return f"the host {host[:100]!r} does not resolve ({exc})"
    private = sorted({info[4][0] for info in infos if non_public_address(info[4][0])})
    if private:
        return f"the host {host[:100]!r} resolves to a non-public address ({', '.join(private[:3])})"
    return ""


def callback_post(*, url: str, body: bytes, headers: dict[str, str], timeout: float,
                  allow_private: bool = False) -> CallbackAnswer:
    """POST a tenant callback (services/webhooks.py); redirects are not followed. Unless
    `allow_private`, a connection that lands on a non-public address is closed unsent."""
    conn, target = _connection(url, timeout)
    started = time.monotonic()
    try:
        conn.connect()
        peer = conn.sock.getpeername()[0]
        if not allow_private and non_public_address(peer):
            return CallbackAnswer(None, _since(started), f"refused: {urlsplit(url).hostname!r} connected to the "
                                                         f"non-public address {peer}; nothing was sent")
        conn.request("POST", target, body=body, headers={"Content-Type": "application/json", **headers})
        response = conn.getresponse()
        response.read()
    except (http.client.HTTPException, OSError) as exc:
        return CallbackAnswer(None, _since(started), f"{type(exc).__name__}: {exc}"[:2000])
    finally:
        conn.close()
    return CallbackAnswer(response.status, _since(started))
