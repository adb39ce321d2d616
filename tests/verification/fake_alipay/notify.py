"""Asynchronous notifications as Alipay sends them: a form-encoded POST signed with Alipay's private
key (RSA2 over every parameter but ``sign`` and ``sign_type``). Anything but the exact body ``success``
(or a connection error) is retried after 4m, 10m, 10m, 1h, 2h, 6h, 15h: 8 deliveries at most, the
same ``notify_id`` each time. Deliveries happen on ``deliver_due()`` (synchronously, for tests) or
from a background pump (``start_pump``)."""

from __future__ import annotations

import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from tests.verification.fake_alipay.keys import sign_rsa2, signing_string
from tests.verification.fake_alipay.state import alipay_time

RETRY_DELAYS = (4 * 60, 10 * 60, 10 * 60, 3600, 2 * 3600, 6 * 3600, 15 * 3600)
MAX_DELIVERIES = 1 + len(RETRY_DELAYS)


@dataclass
class Notification:
    notify_id: str
    notify_type: str
    url: str
    params: dict[str, str]  # everything but notify_time, sign_type and sign (set per delivery)
    created_at: float
    due_at: float
    duplicate: bool = False
    dropped: bool = False
    attempts: int = 0
    acknowledged: bool = False

    @property
    def pending(self) -> bool:
        return not (self.acknowledged or self.dropped or self.attempts >= MAX_DELIVERIES)

    def as_dict(self) -> dict[str, Any]:
        return {"notify_id": self.notify_id, "notify_type": self.notify_type, "url": self.url,
                "params": dict(self.params), "due_at": self.due_at, "attempts": self.attempts,
                "acknowledged": self.acknowledged, "dropped": self.dropped, "pending": self.pending}


@dataclass(frozen=True)
class NotifyDelivery:
    notify_id: str
    notify_type: str
    url: str
    attempt: int  # 1-based, per notification (a duplicate copy shares its attempt number)
    at: float  # simulator clock
    status: int | None
    answer: str
    error: str | None = None
    form: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.answer == "success"

    def as_dict(self) -> dict[str, Any]:
        return {"notify_id": self.notify_id, "notify_type": self.notify_type, "url": self.url,
                "attempt": self.attempt, "at": self.at, "status": self.status, "answer": self.answer,
                "error": self.error, "ok": self.ok}


class NotificationMixin:
    """Needs from the host: lock, faults, ids, alipay_private_pem, notify_timeout, now(), log()."""

    def _init_notifications(self) -> None:
        self.notifications: list[Notification] = []
        self.deliveries: list[NotifyDelivery] = []
        self._delivery_lock = threading.Lock()
        self._pump_stop: threading.Event | None = None
        self._pump: threading.Thread | None = None

    def _notify(self, notify_type: str, url: str, params: dict[str, str]) -> Notification:
        """Queue a notification (call with the lock held)."""
        now = self.now()
        duplicate, drop, delay = self.faults.take_notification_faults()
        note = Notification(self.ids.notify_id(now), notify_type, url, dict(params), now, now + delay,
                            duplicate=duplicate, dropped=drop)
        self.notifications.append(note)
        if drop:
            self.deliveries.append(NotifyDelivery(note.notify_id, notify_type, url, 0, now, None, "",
                                                  "dropped by fault"))
        self.log(f"notification {notify_type} {note.notify_id} -> {url}{' (dropped)' if drop else ''}")
        return note

    def signed_form(self, note: Notification, at: float) -> dict[str, str]:
        form = {**note.params, "notify_id": note.notify_id, "notify_type": note.notify_type,
                "notify_time": alipay_time(at), "charset": "utf-8", "version": "1.0"}
        form["sign"] = sign_rsa2(self.alipay_private_pem, signing_string(form, exclude=("sign", "sign_type")))
        form["sign_type"] = "RSA2"
        return form

    def deliver_due(self) -> list[NotifyDelivery]:
        """Send every notification whose (first or retry) delivery is due on the simulator clock."""
        results: list[NotifyDelivery] = []
        with self._delivery_lock:
            with self.lock:
                now = self.now()
                due = sorted((n for n in self.notifications if n.pending and n.due_at <= now),
                             key=lambda n: n.due_at)
            for note in due:
                results.extend(self._deliver(note))
        return results

    def _deliver(self, note: Notification) -> list[NotifyDelivery]:
        with self.lock:
            at = self.now()
            note.attempts += 1
            attempt = note.attempts
            form = self.signed_form(note, at)
        copies = [self._post(note, form, attempt, at) for _ in range(2 if note.duplicate else 1)]
        with self.lock:
            self.deliveries.extend(copies)
            if any(d.ok for d in copies):
                note.acknowledged = True
            elif note.attempts < MAX_DELIVERIES:
                note.due_at = at + RETRY_DELAYS[note.attempts - 1]
        for d in copies:
            self.log(f"notify {note.notify_type} {note.notify_id} #{attempt} -> {d.status} {d.answer[:40]!r}"
                     f"{' ' + d.error if d.error else ''}")
        return copies

    def _post(self, note: Notification, form: dict[str, str], attempt: int, at: float) -> NotifyDelivery:
        body = urllib.parse.urlencode(form).encode("utf-8")
        request = urllib.request.Request(note.url, data=body, method="POST", headers={
            "Content-Type": "application/x-www-form-urlencoded; charset=utf-8", "User-Agent": "Mozilla/4.0"})
        status: int | None = None
        answer, error = "", None
        try:
            with urllib.request.urlopen(request, timeout=self.notify_timeout) as response:
                status, answer = int(response.status), response.read(4096).decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            status, answer = int(exc.code), exc.read(4096).decode("utf-8", "replace")
        except Exception as exc:  # a broken receiver is a failed delivery, never a simulator crash
            error = f"{type(exc).__name__}: {exc}"
        return NotifyDelivery(note.notify_id, note.notify_type, note.url, attempt, at, status, answer, error,
                              form=form)

    # ---- background delivery (the command-line simulator)
    def start_pump(self, interval: float = 0.5) -> None:
        if self._pump is not None:
            return
        self._pump_stop = threading.Event()
        stop = self._pump_stop

        def pump() -> None:
            while not stop.wait(interval):
                self.deliver_due()

        self._pump = threading.Thread(target=pump, name="alipay-notify-pump", daemon=True)
        self._pump.start()

    def stop_pump(self) -> None:
        if self._pump_stop is not None:
            self._pump_stop.set()
        if self._pump is not None:
            self._pump.join(timeout=5)
        self._pump = self._pump_stop = None

    # ---- reading
    def delivery_log(self, notify_id: str | None = None) -> list[NotifyDelivery]:
        with self.lock:
            return [d for d in self.deliveries if notify_id is None or d.notify_id == notify_id]

    def notification_list(self, notify_type: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            return [n.as_dict() for n in self.notifications if notify_type is None or n.notify_type == notify_type]
