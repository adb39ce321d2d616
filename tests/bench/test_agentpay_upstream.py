"""The gateway bench's upstream (bench.agentpay_upstream), started as the bench starts it and called
over HTTP: by the gateway's own client (agentpay.upstream) and by raw sockets."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import time
import uuid

import pytest

from agentpay.models import PricedRoute
from agentpay.upstream import upstream_forward, upstream_status_query
from bench.common import free_port, wait_port


@pytest.fixture(scope="module")
def upstream():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bench.agentpay_upstream", str(port)])
    try:
        wait_port(port, 30, proc)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def _route(port: int) -> PricedRoute:
    base = f"http://127.0.0.1:{port}"
    return PricedRoute(slug="bench", upstream_base_url=base, upstream_path="/call", method="POST",
                       connect_timeout_seconds=2.0, read_timeout_seconds=5.0, status_query_url=f"{base}/status")


def test_the_gateways_forward_gets_a_2xx_that_echoes_its_idempotency_key(upstream):
    answer = upstream_forward(route=_route(upstream), fulfillment_id="ful_abc", request_id=uuid.uuid4(),
                              path="deep/path", query="x=1", content_type="application/json", body=b'{"q": 1}')
    assert (answer.outcome, answer.status) == ("2xx", 200)
    assert json.loads(answer.body) == {"result": "ok", "key": "ful_abc"}
    assert answer.content_type.startswith("application/json")


def test_the_status_query_contract_answers_succeeded(upstream):
    answer = upstream_status_query(route=_route(upstream), fulfillment_id="ful_xyz")
    assert answer.answer == "succeeded" and answer.http_status == 200


def _raw(port: int, *pieces: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        for piece in pieces:
            sock.sendall(piece)
            time.sleep(0.05)  # each piece arrives on its own
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_a_request_arriving_in_pieces_is_answered_once_its_body_is_complete(upstream):
    body = b'{"q": "' + b"x" * 5000 + b'"}'
    head = (f"POST /call HTTP/1.1\r\nHost: x\r\nIdempotency-Key: ful_pieces\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    raw = _raw(upstream, head[:10], head[10:], body[:100], body[100:])
    status, _, rest = raw.partition(b"\r\n")
    assert status == b"HTTP/1.1 200 OK"
    assert json.loads(rest.partition(b"\r\n\r\n")[2]) == {"result": "ok", "key": "ful_pieces"}


@pytest.mark.parametrize(("request_bytes", "status"), [
    (b"NONSENSE\r\n\r\n", 400),
    (b"GET /elsewhere HTTP/1.1\r\nHost: x\r\n\r\n", 404),
    (b"DELETE /call HTTP/1.1\r\nHost: x\r\n\r\n", 405),
])
def test_what_is_not_the_contract_gets_a_4xx(upstream, request_bytes, status):
    conn = http.client.HTTPConnection("127.0.0.1", upstream, timeout=5)
    conn.connect()
    conn.sock.sendall(request_bytes)
    response = http.client.HTTPResponse(conn.sock)
    response.begin()
    assert response.status == status
    conn.close()
