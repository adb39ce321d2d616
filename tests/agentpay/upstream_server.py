"""A real upstream HTTP API on loopback for the gateway tests (threaded http.server).

The path chooses the behaviour: /ok (200 JSON), /bad (422), /boom (503), /hang (sleeps past the
route's read timeout), /drop (answers 200 with a Content-Length it never fills, then closes),
/code/<n> (answers status n: executed for 2xx and 5xx, not executed for 4xx; a 3xx redirects).
Every call is remembered by its Idempotency-Key, and GET /status/<ful_id> implements the status
query contract from what the server did (or from `status_override`; a number there answers that
HTTP status, "hang" sleeps `hang_seconds`). Status queries are remembered in `status_queries`.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Upstream:
    def __init__(self) -> None:
        self.calls: list[dict] = []
        self.outcomes: dict[str, str] = {}  # ful_id -> succeeded | failed | in_progress
        self.status_override: dict[str, str] = {}
        self.status_queries: list[dict] = []
        self.hang_seconds = 3.0
        self._lock = threading.Lock()
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _json(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.startswith("/status/"):
                    ful = self.path.rsplit("/", 1)[-1]
                    with upstream._lock:
                        upstream.status_queries.append({"ful": ful,
                                                        "request_id": self.headers.get("AgentPay-Request-Id")})
                    status = upstream.status_override.get(ful) or upstream.outcomes.get(ful, "not_found")
                    if status == "hang":
                        time.sleep(upstream.hang_seconds)
                    elif status.isdigit():
                        self._json(int(status), {"error": "not now"})
                    else:
                        self._json(200, {"status": status})
                    return
                self._call()

            def do_POST(self) -> None:
                self._call()

            def _call(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                key = self.headers.get("Idempotency-Key", "")
                with upstream._lock:
                    upstream.calls.append({"path": self.path, "key": key, "body": body})
                what = self.path.split("?")[0].strip("/").split("/")[0]
                if what == "ok":
                    upstream.outcomes[key] = "succeeded"
                    self._json(200, {"result": "delivered", "key": key})
                elif what == "bad":
                    upstream.outcomes[key] = "failed"
                    self._json(422, {"error": "bad input"})
                elif what == "boom":
                    upstream.outcomes[key] = "succeeded"  # it did act, then failed to say so
                    self._json(503, {"error": "overloaded"})
                elif what == "hang":
                    upstream.outcomes[key] = "in_progress"
                    time.sleep(upstream.hang_seconds)
                elif what == "drop":
                    upstream.outcomes[key] = "succeeded"
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", "1000")
                    self.end_headers()
                    self.wfile.write(b'{"result": "deliv')
                    self.wfile.flush()
                    self.close_connection = True
                elif what == "code":
                    status = int(self.path.split("?")[0].strip("/").split("/")[1])
                    upstream.outcomes[key] = "failed" if 400 <= status < 500 else "succeeded"
                    if 300 <= status < 400:
                        self.send_response(status)
                        self.send_header("Location", "/elsewhere")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                    else:
                        self._json(status, {"status": status, "key": key})
                else:
                    self._json(404, {"error": "no such thing"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> Upstream:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
