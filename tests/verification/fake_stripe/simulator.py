"""``StripeSimulator``: the simulator core (`core`) and the HTTP server that serves it, in one object."""

from __future__ import annotations

from tests.verification.fake_stripe.core import SimulatorCore
from tests.verification.fake_stripe.server import make_server
from tests.verification.loopback_http import LoopbackServer, ServedSimulator


class StripeSimulator(ServedSimulator, SimulatorCore):
    """A Stripe-compatible simulator that can serve its API over HTTP (`start`, or use it as a
    context manager). The server's handlers take the core, so they never import this module."""

    thread_name = "stripe-simulator"

    def _make_server(self, host: str, port: int, *, control_api: bool, verbose: bool) -> LoopbackServer:
        return make_server(self, host, port, control_api=control_api, verbose=verbose)

    def _started(self) -> None:
        self.renderer.hosted_base = self.base_url
