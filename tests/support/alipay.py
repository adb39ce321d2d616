"""Shared pytest fixtures for Alipay (issue 20): the simulator on a free loopback port with this
session's keys and a registered app, and a tiny loopback receiver for its notifications.

Registered for every test folder through ``pytest_plugins`` in tests/conftest.py:

* ``alipay_keys`` (session) → ``AlipayKeys``: the app's and Alipay's RSA 2048 key pairs, made once.
* ``alipay_notify_receiver`` → ``NotifyReceiver``: records each POST (form + raw body) and answers
  ``success`` unless told otherwise (``answer_with``).
* ``alipay_sim`` → ``AlipaySimHandle``: a started ``AlipaySimulator`` (stopped afterwards) with the app
  ``APP_ID`` registered, notifications going to the receiver; ``.gateway()`` builds the product's
  ``AlipayGateway`` for it, ``.new_agreement(balance_fen)`` makes a user who signed an agreement.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlencode

import pytest

from subscriptions.providers.alipay.gateway import AlipayGateway
from tests.verification.fake_alipay import AlipayKeys, AlipaySimulator, session_keys, sign_rsa2, signing_string
from tests.verification.loopback_http import LoopbackReceiver

APP_ID = "2021000000000001"


@dataclass(frozen=True)
class ReceivedNotification:
    path: str
    form: dict[str, str]
    body: bytes
    content_type: str


class NotifyReceiver:
    """A loopback HTTP server standing in for the product's notification endpoint."""

    def __init__(self) -> None:
        self.received: list[ReceivedNotification] = []
        self._answers: list[tuple[int, str]] = []
        self.default_answer: tuple[int, str] = (200, "success")
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._endpoint = LoopbackReceiver(self._on_post, path="/notify/alipay/",
                                          thread_name="alipay-notify-receiver")
        self.url = self._endpoint.url

    def _on_post(self, path: str, body: bytes, content_type: str) -> tuple[int, bytes]:
        form = dict(parse_qsl(body.decode("utf-8"), keep_blank_values=True))
        status, text = self._record(ReceivedNotification(path, form, body, content_type))
        return status, text.encode("utf-8")

    def answer_with(self, *answers: str | tuple[int, str]) -> None:
        """The next deliveries get these answers in order (a string is a 200 with that body), then
        the default ``success``."""
        with self._lock:
            self._answers.extend(a if isinstance(a, tuple) else (200, a) for a in answers)

    def _record(self, note: ReceivedNotification) -> tuple[int, str]:
        with self._lock:
            self.received.append(note)
            self._arrived.notify_all()
            return self._answers.pop(0) if self._answers else self.default_answer

    def forms(self, notify_type: str | None = None) -> list[dict[str, str]]:
        with self._lock:
            return [n.form for n in self.received if notify_type is None or n.form.get("notify_type") == notify_type]

    def wait_for(self, count: int, timeout: float = 5.0) -> list[ReceivedNotification]:
        """Block until ``count`` notifications arrived in all (for the background pump)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while len(self.received) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{len(self.received)} notifications arrived, expected {count}")
                self._arrived.wait(left)
            return list(self.received)

    def stop(self) -> None:
        self._endpoint.stop()


@dataclass
class AlipaySimHandle:
    sim: AlipaySimulator
    keys: AlipayKeys
    receiver: NotifyReceiver
    app_id: str = APP_ID
    agreements: list[str] = field(default_factory=list)

    @property
    def gateway_url(self) -> str:
        return self.sim.gateway_url

    def gateway(self, *, timeout_seconds: float = 2.0, app_id: str | None = None,
                app_private_key_pem: str | None = None, alipay_public_key_pem: str | None = None,
                notify_url: str | None = None) -> AlipayGateway:
        """The product's client for this simulator (each key can be swapped for a hostile test)."""
        return AlipayGateway(app_id or self.app_id, app_private_key_pem or self.keys.app_private_pem,
                             alipay_public_key_pem or self.keys.alipay_public_pem, self.sim.gateway_url,
                             self.receiver.url if notify_url is None else notify_url, timeout_seconds)

    def new_agreement(self, balance_fen: int = 10_000, external_agreement_no: str | None = None) -> tuple[str, str]:
        """(user_id, agreement_no): a user with ``balance_fen`` who signed a withholding agreement."""
        user_id = self.sim.create_user(balance_fen)
        agreement_no = self.sim.sign_agreement(self.app_id, user_id,
                                               external_agreement_no or f"sub-{len(self.agreements) + 1}")
        self.agreements.append(agreement_no)
        return user_id, agreement_no


def raw_gateway_call(gateway_url: str, app_id: str, app_private_key_pem: str, method: str,
                     biz: dict[str, object] | None = None, *, post: bool = False, sign_type: str = "RSA2",
                     **extra: str) -> tuple[int, str]:
    """(HTTP status, body text) of a hand-signed gateway call, bypassing the SDK (hostile cases)."""
    params = {"app_id": app_id, "method": method, "charset": "utf-8", "sign_type": sign_type,
              "timestamp": time.strftime("%Y-%m-%d %H:%M:%S"), "version": "1.0",
              "biz_content": json.dumps(biz or {}, separators=(",", ":"), ensure_ascii=False), **extra}
    params["sign"] = sign_rsa2(app_private_key_pem, signing_string(params))
    data = urlencode(params).encode("utf-8")
    request = (urllib.request.Request(gateway_url, data=data, method="POST", headers={
        "Content-Type": "application/x-www-form-urlencoded; charset=utf-8"}) if post
        else urllib.request.Request(f"{gateway_url}?{data.decode()}"))
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status), response.read().decode("utf-8")
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode("utf-8", "replace")


@pytest.fixture(scope="session")
def alipay_keys() -> AlipayKeys:
    return session_keys()


@pytest.fixture
def alipay_notify_receiver() -> Iterator[NotifyReceiver]:
    receiver = NotifyReceiver()
    yield receiver
    receiver.stop()


@pytest.fixture
def alipay_sim(alipay_keys: AlipayKeys, alipay_notify_receiver: NotifyReceiver) -> Iterator[AlipaySimHandle]:
    sim = AlipaySimulator(alipay_private_pem=alipay_keys.alipay_private_pem,
                          alipay_public_pem=alipay_keys.alipay_public_pem, notify_timeout=2.0)
    sim.start()
    sim.register_app(APP_ID, alipay_keys.app_public_pem, alipay_notify_receiver.url)
    yield AlipaySimHandle(sim, alipay_keys, alipay_notify_receiver)
    sim.stop()
