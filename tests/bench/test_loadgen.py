"""The webhook load generator (bench.loadgen.open_loop) against a loopback HTTP server: every body is
signed before the timed window, with its due time as the signature's timestamp, and the client's
own CPU time and lateness come back with the results."""

import gc
import hashlib
import hmac
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench.common import without_collector_pauses
from bench.loadgen import open_loop, sign

SECRET = "whsec_loadgen_test"


class _Recorder(BaseHTTPRequestHandler):
    seen: list[tuple[float, bytes, str]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.seen.append((time.time(), body, self.headers["Stripe-Signature"]))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_open_loop_sends_bodies_signed_before_the_window_with_their_due_time(monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    _Recorder.seen = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    signed_at: list[int | None] = []

    def counting_sign(body: bytes, secret: str, timestamp: int | None = None) -> str:
        signed_at.append(timestamp)
        return sign(body, secret, timestamp)

    monkeypatch.setattr("bench.loadgen.sign", counting_sign)
    bodies = [f'{{"id": "evt_{i}"}}'.encode() for i in range(40)]
    try:
        out = open_loop(f"http://127.0.0.1:{server.server_port}/", bodies, 20.0, SECRET)
    finally:
        server.shutdown()
        server.server_close()

    assert sorted(r[3] for r in out["results"]) == list(range(40))
    assert all(r[2] == 200 for r in out["results"])
    # Signed once each, up front, with an explicit timestamp: nothing is signed inside the loop.
    assert len(signed_at) == 40 and None not in signed_at
    by_body = {body: (received, header) for received, body, header in _Recorder.seen}
    for body in bodies:
        received, header = by_body[body]
        stamp, mac = (part.split("=", 1)[1] for part in header.split(","))
        expected = hmac.new(SECRET.encode(), f"{stamp}.".encode() + body, hashlib.sha256).hexdigest()
        assert mac == expected
        # Its due time (20/s: 40 deliveries over 2 s), within the second the stamp is truncated to.
        assert int(stamp) <= received < int(stamp) + 2
    assert int(signed_at[-1]) - int(signed_at[0]) in (1, 2)
    assert out["client_cpu_seconds"] > 0
    assert out["client_late_p99_ms"] >= 0


def test_the_collector_is_off_during_a_timed_run_and_back_on_after():
    assert gc.isenabled()
    with without_collector_pauses():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), without_collector_pauses():
        raise RuntimeError("a failed run")
    assert gc.isenabled()
