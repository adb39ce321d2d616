"""bench.rawhttp and the AgentPay open loop built on it, against a loopback HTTP server."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench.agentpay_bench import open_loop
from bench.rawhttp import request_bytes, status_of


class _Recorder(BaseHTTPRequestHandler):
    seen: list[tuple[str, dict[str, str], bytes]] = []

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.seen.append((self.path, dict(self.headers), body))
        answer = b'{"type": "payment-required"}'
        self.send_response(402 if json.loads(body)["q"] % 2 == 0 else 200)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def server():
    _Recorder.seen = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()


def test_each_request_arrives_whole_with_its_headers_and_its_answer_status_comes_back(server):
    port = server.server_address[1]
    out = open_loop(f"http://127.0.0.1:{port}/agentpay/v1/routes/r/run", 6, 200.0,
                    lambda i: {"Authorization": "Bearer ak_x", "Idempotency-Key": f"k-{i}",
                               "Content-Type": "application/json"})
    assert sorted(r[2] for r in out["results"]) == [200, 200, 200, 402, 402, 402]
    assert all(r[0] >= r[1] >= 0 for r in out["results"])  # from due >= from send
    assert sorted(h["Idempotency-Key"] for _, h, _ in _Recorder.seen) == [f"k-{i}" for i in range(6)]
    path, headers, body = next(s for s in _Recorder.seen if s[1]["Idempotency-Key"] == "k-3")
    assert path == "/agentpay/v1/routes/r/run" and json.loads(body) == {"q": 3}
    assert headers["Authorization"] == "Bearer ak_x" and headers["Connection"] == "close"


def test_a_refused_connection_counts_as_status_0_not_an_exception():
    out = open_loop("http://127.0.0.1:9/x", 2, 100.0, lambda i: {})
    assert [r[2] for r in out["results"]] == [0, 0]


def test_the_request_bytes_and_the_status_line():
    raw = request_bytes("POST", "127.0.0.1", 8000, "/p", {"Host": "ignored", "X-A": "1"}, b"{}")
    assert raw == (b"POST /p HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nContent-Length: 2\r\nConnection: close\r\n"
                   b"X-A: 1\r\n\r\n{}")
    assert status_of(b"HTTP/1.1 402 Payment Required\r\n\r\n") == 402
    with pytest.raises(ValueError):
        status_of(b"")
    with pytest.raises(ValueError):
        status_of(b"SSH-2.0-OpenSSH\r\n")
