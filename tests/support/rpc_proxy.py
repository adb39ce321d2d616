"""A loopback JSON-RPC proxy between the product and the node, for fault tests (issue 18).

    with RpcProxy(chain.rpc_url) as proxy:
        network = chain.make_network(rpc_url=proxy.url)
        proxy.drop("eth_sendRawTransaction")       # forwarded, then the connection is closed:
                                                   # "the node accepted it but we never heard"
        proxy.drop("eth_getTransactionReceipt", after_forward=False)   # never reaches the node
        proxy.delay("eth_getTransactionReceipt", 3)                    # answers after 3 s
        proxy.error("eth_sendRawTransaction", "nonce too low")          # a JSON-RPC error answer
        proxy.calls                                                    # methods seen, in order

`RpcProxy(url, keep=("eth_sendRawTransaction",))` also keeps the request of every call of those
methods it forwarded (what the node saw), as (method, params) in `payloads`.

Rules match a method name (or "*") and apply `times` times (None: every call); the first rule
that still has uses wins. A dropped call closes the socket without a byte of answer, which the
client sees as a lost connection (agentpay.chain.rpc.ChainTimeout).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests


@dataclass
class Rule:
    method: str
    action: str  # "drop" | "delay" | "error"
    after_forward: bool = True
    seconds: float = 0.0
    message: str = ""
    code: int = -32000
    times: int | None = 1

    def matches(self, method: str) -> bool:
        return (self.times is None or self.times > 0) and self.method in ("*", method)


class RpcProxy:
    def __init__(self, upstream_url: str, *, forward_timeout: float = 30.0, keep: tuple[str, ...] = ()) -> None:
        self.upstream_url = upstream_url
        self.keep = frozenset(keep)
        self.payloads: list[tuple[str, list]] = []
        self.forward_timeout = forward_timeout
        self.calls: list[str] = []
        self.forwarded: list[str] = []
        self.dropped: list[str] = []
        self._rules: list[Rule] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- rules --
    def drop(self, method: str, after_forward: bool = True, times: int | None = 1) -> None:
        self._add(Rule(method, "drop", after_forward=after_forward, times=times))

    def delay(self, method: str, seconds: float, times: int | None = None) -> None:
        self._add(Rule(method, "delay", seconds=seconds, times=times))

    def error(self, method: str, message: str, *, code: int = -32000, after_forward: bool = False,
              times: int | None = 1) -> None:
        """Answer with a JSON-RPC error (after forwarding the call if `after_forward`)."""
        self._add(Rule(method, "error", message=message, code=code, after_forward=after_forward, times=times))

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    def _add(self, rule: Rule) -> None:
        with self._lock:
            self._rules.append(rule)

    def _take(self, method: str) -> Rule | None:
        with self._lock:
            self.calls.append(method)
            for rule in self._rules:
                if rule.matches(method):
                    if rule.times is not None:
                        rule.times -= 1
                    return rule
        return None

    # -- lifecycle --
    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("RpcProxy is not started")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> RpcProxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format, *args):  # noqa: A002 - the base class's name
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    request = json.loads(body)
                    method = request.get("method", "") if isinstance(request, dict) else "batch"
                    params = request.get("params", []) if isinstance(request, dict) else []
                    request_id = request.get("id") if isinstance(request, dict) else None
                except ValueError:
                    method, request_id, params = "", None, []
                rule = proxy._take(method)
                if rule is not None and rule.action == "delay":
                    time.sleep(rule.seconds)
                    rule = None
                if rule is not None and not rule.after_forward:
                    self._refuse(rule, method, request_id)
                    return
                try:
                    upstream = requests.post(proxy.upstream_url, data=body, timeout=proxy.forward_timeout,
                                             headers={"Content-Type": "application/json"})
                except requests.RequestException:
                    self.close_connection = True
                    return
                with proxy._lock:
                    proxy.forwarded.append(method)
                    if method in proxy.keep:
                        proxy.payloads.append((method, params))
                if rule is not None:
                    self._refuse(rule, method, request_id)
                    return
                self._answer(upstream.status_code, upstream.content)

            def _refuse(self, rule: Rule, method: str, request_id) -> None:
                if rule.action == "error":
                    error = {"code": rule.code, "message": rule.message}
                    payload = {"jsonrpc": "2.0", "id": request_id, "error": error}
                    self._answer(200, json.dumps(payload).encode())
                    return
                with proxy._lock:
                    proxy.dropped.append(method)
                # No answer at all: the client's read ends with the connection closed.
                self.close_connection = True

            def _answer(self, status: int, content: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="rpc-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> RpcProxy:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
