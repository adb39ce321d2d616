"""The simulation's upstream API on loopback: what it did is the truth the auditor checks against.

`POST /<behaviour>` with the gateway's `Idempotency-Key: ful_…`:

    ok     acts, answers 200                    bad    does not act, answers 422
    boom   acts, answers 503                    sick   does not act, answers 500
    hang   acts after `hang_seconds` (the gateway has given up by then), answers nothing useful
    drop   acts, answers 200 with a Content-Length it never fills, closes

`GET /status/<ful_id>` is the status-query contract (wallet-ledger-spec §9.3) answered from what
the server did: succeeded / failed / in_progress, or not_found (fenced: the key is refused from
then on) for a call it never saw; `status_faults` > 0 answers that many queries with a 500.
Every answer it served is logged (`served`, `status_served`) for the auditor.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ACTS = {"ok": True, "boom": True, "drop": True, "hang": True, "bad": False, "sick": False}
STATUS = {"ok": 200, "bad": 422, "boom": 503, "sick": 500}


class SimUpstream:
    def __init__(self, hang_seconds: float = 0.4) -> None:
        self.hang_seconds = hang_seconds
        self.lock = threading.Lock()
        self.calls: dict[str, int] = {}  # ful_id -> times called (must stay ≤ 1)
        self.acted: dict[str, str] = {}  # ful_id -> "succeeded" | "failed" | "in_progress"
        self.served: dict[str, tuple[int, bool]] = {}  # ful_id -> (status sent, body complete)
        self.status_served: dict[str, set[str]] = {}  # ful_id -> answers given by the status query
        self.fenced: set[str] = set()
        self.status_faults = 0
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
                if not self.path.startswith("/status/"):
                    self._json(404, {"error": "no such thing"})
                    return
                ful = self.path.rsplit("/", 1)[-1]
                with upstream.lock:
                    if upstream.status_faults > 0:
                        upstream.status_faults -= 1
                        answer = None
                    else:
                        answer = upstream.acted.get(ful)
                        if answer is None:
                            upstream.fenced.add(ful)
                            answer = "not_found"
                        upstream.status_served.setdefault(ful, set()).add(answer)
                if answer is None:
                    self._json(500, {"error": "status service down"})
                else:
                    self._json(200, {"fulfillment_id": ful, "status": answer, "fenced": answer == "not_found"})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                ful = self.headers.get("Idempotency-Key", "")
                what = self.path.split("?")[0].strip("/").split("/")[0]
                with upstream.lock:
                    upstream.calls[ful] = upstream.calls.get(ful, 0) + 1
                    refused = ful in upstream.fenced or upstream.calls[ful] > 1
                    if not refused and what in ACTS:
                        upstream.acted[ful] = ("in_progress" if what == "hang" else
                                               "succeeded" if ACTS[what] else "failed")
                if refused or what not in ACTS:
                    self._json(409 if refused else 404, {"error": "refused"})
                    return
                if what == "hang":
                    time.sleep(upstream.hang_seconds)
                    with upstream.lock:
                        upstream.acted[ful] = "succeeded"
                    self.close_connection = True
                    return
                if what == "drop":
                    with upstream.lock:
                        upstream.served[ful] = (200, False)
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", "1000")
                    self.end_headers()
                    self.wfile.write(b'{"result": "deliv')
                    self.wfile.flush()
                    self.close_connection = True
                    return
                with upstream.lock:
                    upstream.served[ful] = (STATUS[what], True)
                self._json(STATUS[what], {"key": ful, "what": what})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def in_flight(self, ful: str) -> bool:
        with self.lock:
            return self.acted.get(ful) == "in_progress"

    def start(self) -> SimUpstream:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
