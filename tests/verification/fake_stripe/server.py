"""HTTP transport: a ThreadingHTTPServer that hands each request to ``StripeApi``."""

from __future__ import annotations

import contextlib
import socket
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from tests.verification.fake_stripe.api import Request, StripeApi
from tests.verification.fake_stripe.control import ControlApi
from tests.verification.fake_stripe.core import SimulatorCore
from tests.verification.fake_stripe.hosted import HostedPages


class SimulatorServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], api: StripeApi, *, verbose: bool = False) -> None:
        super().__init__(address, SimulatorHandler)
        self.api = api
        self.verbose = verbose


class SimulatorHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "StripeSimulator/1.0"
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

    do_GET = do_POST = do_DELETE = _handle

    def log_message(self, format: str, *args: object) -> None:
        if self.server.verbose:
            sys.stderr.write(f"[stripe-sim] {self.address_string()} {format % args}\n")


def make_server(sim: SimulatorCore, host: str, port: int, *, control_api: bool = True,
                verbose: bool = False) -> SimulatorServer:
    api = StripeApi(sim, ControlApi(sim) if control_api else None, HostedPages(sim))
    return SimulatorServer((host, port), api, verbose=verbose)
