"""Run `localstripe` (an independent fake Stripe server, PyPI) for compatibility tests.

`LocalStripe()` starts it as a child process listening on 127.0.0.1 only, on a port that the
test process picks and hands over as an already-bound socket (no port race), waits until it
answers and stops it again (SIGTERM, then SIGKILL). Its own CLI is not used because
`localstripe --port N` binds every interface (`::`) and reads and rewrites one shared
`/tmp/localstripe.pickle` on every change; the launcher below serves the same aiohttp app with
that persistence switched off, so each instance starts empty and leaves no file behind.

The child also exits by itself when its stdin reaches EOF, i.e. when the test process dies
without reaching `stop()`, so no server outlives the test run.

`WebhookReceiver()` is a tiny HTTP endpoint on 127.0.0.1 that records what localstripe posts
(raw body and `Stripe-Signature`), for tests that verify the signatures.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

LOOPBACK = "127.0.0.1"
API_KEY = "sk_test_localstripe"

_LAUNCHER = r"""
import os, socket, sys, threading

from aiohttp import web
from localstripe import resources, server

# No persistence: the stock server pickles its whole store to /tmp/localstripe.pickle, shared by
# every instance on the machine, after each write.
resources.Store.dump_to_disk = lambda self: None
resources.Store.try_load_from_disk = lambda self: None


def _exit_when_parent_goes():
    sys.stdin.buffer.read()
    os._exit(0)


threading.Thread(target=_exit_when_parent_goes, daemon=True).start()
sock = socket.socket(fileno=int(sys.argv[1]))
web.run_app(server.app, sock=sock, print=None, access_log=None, shutdown_timeout=1.0)
"""


class LocalStripeError(RuntimeError):
    pass


class LocalStripe:
    """`with LocalStripe() as ls:` → `ls.base_url` is e.g. `http://127.0.0.1:40123`."""

    def __init__(self, *, python: str = sys.executable, start_timeout: float = 20.0) -> None:
        self.python = python
        self.start_timeout = start_timeout
        self.port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        # Server output, shown when it fails to start; closed with the context manager.
        self._log = tempfile.TemporaryFile()  # noqa: SIM115

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise LocalStripeError("localstripe is not running")
        return f"http://{LOOPBACK}:{self.port}"

    # ---- lifecycle
    def start(self) -> LocalStripe:
        if self._proc is not None:
            raise LocalStripeError("already started")
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.bind((LOOPBACK, 0))
            listener.listen(128)
            self.port = listener.getsockname()[1]
            self._proc = subprocess.Popen(
                [self.python, "-c", _LAUNCHER, str(listener.fileno())],
                pass_fds=(listener.fileno(),), stdin=subprocess.PIPE, stdout=self._log, stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        finally:
            listener.close()  # the child holds its own copy
        atexit.register(self.stop)
        try:
            self._wait_until_answering()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_until_answering(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self._proc is not None and self._proc.poll() is not None:
                raise LocalStripeError(f"localstripe exited with {self._proc.returncode}:\n{self.log()}")
            try:
                # The Stripe.js stand-in: no authentication, no state, no webhook.
                with urllib.request.urlopen(f"{self.base_url}/js.stripe.com/v3/", timeout=1.0) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise LocalStripeError(f"localstripe did not answer within {self.start_timeout} s:\n{self.log()}")
            time.sleep(0.05)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        atexit.unregister(self.stop)
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        if proc.stdin is not None:
            proc.stdin.close()

    def log(self) -> str:
        self._log.seek(0)
        return self._log.read().decode("utf-8", "replace")[-4000:]

    def __enter__(self) -> LocalStripe:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._log.close()

    # ---- localstripe's own configuration API and test-only routes
    def register_webhook(self, url: str, secret: str, *, name: str = "tests", events: list[str] | None = None) -> None:
        """`POST /_config/webhooks/<name>`: localstripe then posts every event (or only `events`)
        to `url`, signed with `secret`. Registering the same name again replaces it."""
        body: dict[str, Any] = {"url": url, "secret": secret}
        if events is not None:
            body["events"] = events
        self.request("POST", f"/_config/webhooks/{urllib.parse.quote(name)}", json_body=body)

    def flush(self) -> None:
        """`DELETE /_config/data`: forget every object (registered webhooks stay)."""
        self.request("DELETE", "/_config/data")

    def authenticate_payment_intent(self, payment_intent_id: str, *, client_secret: str, success: bool) -> dict:
        """Stand-in for the customer's 3-D Secure challenge (localstripe's Stripe.js calls it):
        `success=False` fails the authentication, which fails the invoice of the payment intent."""
        return self.request(
            "POST", f"/v1/payment_intents/{payment_intent_id}/_authenticate",
            form={"client_secret": client_secret, "success": "true" if success else "false"},
        )

    def request(self, method: str, path: str, *, json_body: dict | None = None, form: dict | None = None,
                headers: dict[str, str] | None = None) -> Any:
        data = None
        all_headers = {"Authorization": f"Bearer {API_KEY}", **(headers or {})}
        if json_body is not None:
            data = json.dumps(json_body).encode()
            all_headers["Content-Type"] = "application/json"
        elif form is not None:
            data = urllib.parse.urlencode(form).encode()
            all_headers["Content-Type"] = "application/x-www-form-urlencoded"
        req = urllib.request.Request(self.base_url + path, data=data, method=method, headers=all_headers)
        try:
            with urllib.request.urlopen(req, timeout=10) as response:
                text = response.read().decode()
        except urllib.error.HTTPError as exc:
            raise LocalStripeError(f"{method} {path} → {exc.code}: {exc.read().decode(errors='replace')}") from exc
        return json.loads(text) if text.strip() else None


@dataclass(frozen=True)
class ReceivedWebhook:
    body: bytes
    signature: str
    headers: dict[str, str]

    @property
    def event(self) -> dict[str, Any]:
        return json.loads(self.body)

    @property
    def type(self) -> str:
        return self.event.get("type", "")


class WebhookReceiver:
    """`with WebhookReceiver() as hooks:` → `hooks.url`; `hooks.wait_for("invoice.payment_failed")`."""

    def __init__(self) -> None:
        self.received: list[ReceivedWebhook] = []
        self._cond = threading.Condition()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("receiver is not running")
        return f"http://{LOOPBACK}:{self._server.server_address[1]}/webhooks/stripe/"

    def __enter__(self) -> WebhookReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                hook = ReceivedWebhook(body=body, signature=self.headers.get("Stripe-Signature", ""),
                                       headers=dict(self.headers.items()))
                with receiver._cond:
                    receiver.received.append(hook)
                    receiver._cond.notify_all()
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self._server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = self._thread = None

    def wait_for(
        self, event_type: str, *, timeout: float = 10.0, match: dict[str, str] | None = None
    ) -> ReceivedWebhook:
        """The first received event of `event_type` whose `data.object` has the `match` values."""
        deadline = time.monotonic() + timeout

        def found() -> ReceivedWebhook | None:
            for hook in self.received:
                if hook.type != event_type:
                    continue
                obj = hook.event.get("data", {}).get("object", {})
                if all(obj.get(k) == v for k, v in (match or {}).items()):
                    return hook
            return None

        with self._cond:
            while (hook := found()) is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    seen = [h.type for h in self.received]
                    raise AssertionError(f"no {event_type} webhook {match or ''} within {timeout} s; got {seen}")
                self._cond.wait(remaining)
            return hook
