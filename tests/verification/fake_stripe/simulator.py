"""``StripeSimulator``: the simulator core (`core`) and the HTTP server that serves it, in one object."""

from __future__ import annotations

import threading
from typing import Any

from tests.verification.fake_stripe.core import SimulatorCore
from tests.verification.fake_stripe.server import make_server


class StripeSimulator(SimulatorCore):
    """A Stripe-compatible simulator that can serve its API over HTTP (`start`, or use it as a
    context manager). The server's handlers take the core, so they never import this module."""

    _server: Any = None
    _thread: threading.Thread | None = None

    # ---- server
    def start(self, host: str = "127.0.0.1", port: int = 0, *, control_api: bool = True,
              verbose: bool = False) -> str:
        if self._server is not None:
            return self.base_url
        self._server = make_server(self, host, port, control_api=control_api, verbose=verbose)
        self.renderer.hosted_base = self.base_url
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="stripe-simulator", daemon=True)
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

    def __enter__(self) -> StripeSimulator:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
