"""Alert delivery tests: a real webhook receiver on loopback and the on-call settings."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

WEBHOOK_SECRET = "whsec_alerts_test"
ONCALL = ["oncall@example.com", "lead@example.com"]


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class WebhookReceiver:
    """Answers each POST with the next status in `answers` (then the last one again)."""

    url: str = ""
    answers: list[int] = field(default_factory=lambda: [200])
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_status(self) -> int:
        with self.lock:
            return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


@pytest.fixture
def webhook_receiver():
    receiver = WebhookReceiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            receiver.received.append(Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            status = receiver.next_status()
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args) -> None:  # keep the test output clean
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/T000/B000/secretpath"
    yield receiver
    server.shutdown()
    server.server_close()


@pytest.fixture
def alert_channels(settings, webhook_receiver):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.ALERT_ONCALL_EMAILS = list(ONCALL)
    settings.ALERT_WEBHOOK_URL = webhook_receiver.url
    settings.ALERT_WEBHOOK_SECRET = WEBHOOK_SECRET
    settings.SITE_URL = "https://billing.example.com"
    settings.ALERT_WEBHOOK_TIMEOUT_SECONDS = 2
    return webhook_receiver
