"""HTTP transport: the shared loopback server (tests/verification/loopback_http.py) handing each
request to ``StripeApi``."""

from __future__ import annotations

from tests.verification.fake_stripe.api import Request, StripeApi
from tests.verification.fake_stripe.control import ControlApi
from tests.verification.fake_stripe.core import SimulatorCore
from tests.verification.fake_stripe.hosted import HostedPages
from tests.verification.loopback_http import LoopbackServer


def make_server(sim: SimulatorCore, host: str, port: int, *, control_api: bool = True,
                verbose: bool = False) -> LoopbackServer:
    api = StripeApi(sim, ControlApi(sim) if control_api else None, HostedPages(sim))
    return LoopbackServer((host, port), api, request_type=Request, tag="stripe-sim", verbose=verbose)
