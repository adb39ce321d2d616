"""``AlipaySimulator``: the core plus its HTTP server on loopback (tests/verification/loopback_http.py)."""

from __future__ import annotations

from tests.verification.fake_alipay.api import AlipayApi, Request
from tests.verification.fake_alipay.control import ControlApi
from tests.verification.fake_alipay.core import AlipaySimulatorCore
from tests.verification.loopback_http import LoopbackServer, ServedSimulator


class AlipaySimulator(ServedSimulator, AlipaySimulatorCore):
    """An Alipay-compatible simulator serving ``/gateway.do`` over HTTP (`start`, or a context manager)."""

    thread_name = "alipay-simulator"

    def _make_server(self, host: str, port: int, *, control_api: bool, verbose: bool) -> LoopbackServer:
        api = AlipayApi(self, ControlApi(self) if control_api else None)
        return LoopbackServer((host, port), api, request_type=Request, tag="alipay-sim", verbose=verbose)

    def _started(self) -> None:
        self.bill_base_url = self.base_url

    @property
    def gateway_url(self) -> str:
        return f"{self.base_url}/gateway.do"

    def stop(self) -> None:
        self.stop_pump()
        super().stop()
