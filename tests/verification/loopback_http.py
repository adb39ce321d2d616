"""The HTTP side both provider simulators share: a ThreadingHTTPServer on loopback that hands
each request to the simulator's API object, honours an answer that hangs (a timeout), and the
start/stop life cycle of a simulator that serves itself."""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import urlsplit


class Api(Protocol):
    def handle(self, request: Any) -> Any: ...


class LoopbackServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], api: Api, *, request_type: type, tag: str,
                 verbose: bool = False) -> None:
        super().__init__(address, LoopbackHandler)
        self.api = api
        self.request_type = request_type  # the simulator's Request(method, path, query, body, headers)
        self.tag = tag
        self.verbose = verbose


class LoopbackHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "ProviderSimulator/1.0"
    server: LoopbackServer

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        url = urlsplit(self.path)
        request = self.server.request_type(self.command, url.path, url.query, body,
                                           {k.lower(): v for k, v in self.headers.items()})
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
            sys.stderr.write(f"[{self.server.tag}] {self.address_string()} {format % args}\n")


class ServedSimulator(ABC):
    """start() / stop() / `with` for a simulator whose `_make_server` builds its LoopbackServer."""

    _server: Any = None
    _thread: threading.Thread | None = None
    thread_name = "provider-simulator"

    @abstractmethod
    def _make_server(self, host: str, port: int, *, control_api: bool, verbose: bool) -> LoopbackServer: ...

    @abstractmethod
    def _started(self) -> None:
        """Called once the server is up (each simulator learns its own address)."""

    def start(self, host: str = "127.0.0.1", port: int = 0, *, control_api: bool = True,
              verbose: bool = False) -> str:
        if self._server is None:
            self._server = self._make_server(host, port, control_api=control_api, verbose=verbose)
            self._started()
            self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                            name=self.thread_name, daemon=True)
            self._thread.start()
        return self.base_url

    @property
    def base_url(self) -> str:
        if self._server is None:
            raise RuntimeError("the simulator is not serving; call start()")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> Any:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class LoopbackReceiver:
    """A loopback HTTP endpoint standing in for the product's notification URL: each POST's
    (path, body, content type) goes to `answer`, whose (status, text) is sent back as plain text."""

    def __init__(self, answer: Callable[[str, bytes, str], tuple[int, bytes]], *, path: str,
                 thread_name: str) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, payload = answer(self.path, body, self.headers.get("Content-Type", ""))
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=thread_name, daemon=True)
        self._thread.start()
        host, port = self._server.server_address[:2]
        self.url = f"http://{host}:{port}{path}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
