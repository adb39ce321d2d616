"""HTTP transport (a ThreadingHTTPServer on loopback) and ``AlipaySimulator``: the core plus its server."""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from tests.verification.fake_alipay.api import AlipayApi, Request
from tests.verification.fake_alipay.control import ControlApi
from tests.verification.fake_alipay.core import AlipaySimulatorCore


class SimulatorServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], api: AlipayApi, *, verbose: bool = False) -> None:
        super().__init__(address, SimulatorHandler)
        self.api = api
        self.verbose = verbose


class SimulatorHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "AlipaySimulator/1.0"
    server: SimulatorServer

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        url = urlsplit(self.path)
        request = Request(self.command, url.path, url.query, body, {k.lower(): v for k, v in self.headers.items()})
        response = self.server.api.handle(request)
        if response.hang is not None:
            time.sleep(response.hang)
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.send_response(response.status)
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(response.body)))
        self.end_headers()
        self.wfile.write(response.body)

    do_GET = do_POST = _handle

    def log_message(self, format: str, *args: object) -> None:
        if self.server.verbose:
            sys.stderr.write(f"[alipay-sim] {self.address_string()} {format % args}\n")


class AlipaySimulator(AlipaySimulatorCore):
    """An Alipay-compatible simulator serving ``/gateway.do`` over HTTP (`start`, or a context manager)."""

    _server: Any = None
    _thread: threading.Thread | None = None

    def start(self, host: str = "127.0.0.1", port: int = 0, *, control_api: bool = True,
              verbose: bool = False) -> str:
        if self._server is None:
            api = AlipayApi(self, ControlApi(self) if control_api else None)
            self._server = SimulatorServer((host, port), api, verbose=verbose)
            self.base_url = self._address()
            self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                            name="alipay-simulator", daemon=True)
            self._thread.start()
        return self.base_url

    def _address(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def gateway_url(self) -> str:
        return f"{self.base_url}/gateway.do"

    def stop(self) -> None:
        self.stop_pump()
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> AlipaySimulator:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
