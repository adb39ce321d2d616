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

import http.client
import json
import uuid
from dataclasses import dataclass
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
    `error: …` when it did not answer the contract; `fenced` for a not_found that fences the key."""

    answer: str
    fenced: bool = False


def upstream_status_query(*, route: PricedRoute, fulfillment_id: str) -> StatusAnswer:
    """GET <status_query_url>/<ful_id> (wallet-ledger-spec §9.3)."""
    if not route.status_query_url:
        return StatusAnswer("error: the route has no status query URL")
    url = route.status_query_url.rstrip("/") + "/" + quote(fulfillment_id)
    conn, target = _connection(url, settings.AGENTPAY_STATUS_QUERY_TIMEOUT_SECONDS)
    try:
        conn.request("GET", target, headers={"Accept": "application/json"})
        response = conn.getresponse()
        data = response.read()
    except (http.client.HTTPException, OSError) as exc:
        return StatusAnswer(f"error: {type(exc).__name__}: {exc}")
    finally:
        conn.close()
    if response.status != 200:  # only a 200 counts (§9.3); a 404 page is not "not found"
        return StatusAnswer(f"error: HTTP {response.status}")
    try:
        body = json.loads(data)
        status = body["status"]
    except (ValueError, KeyError, TypeError):
        return StatusAnswer("error: not the status contract")
    if body.get("fulfillment_id", fulfillment_id) != fulfillment_id:
        return StatusAnswer(f"error: the answer is about {str(body.get('fulfillment_id'))[:64]}")
    if status not in ("succeeded", "failed", "not_found", "in_progress"):
        return StatusAnswer(f"error: status {str(status)[:40]!r}")
    return StatusAnswer(status, fenced=status == "not_found" and body.get("fenced") is True)
