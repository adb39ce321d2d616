"""Signed webhook delivery: an outbox of events, sent to a sink (URL or callable) on demand or
automatically, in creation, reversed or shuffled order, with duplicate and delay faults."""

from __future__ import annotations

import hashlib
import hmac
import json
import random
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

Sink = Callable[[bytes, dict[str, str]], int]


def signature_header(body: bytes, secrets: Iterable[str], timestamp: int) -> str:
    """``t=…,v1=…[,v1=…]``: one v1 signature per secret, as Stripe does while a secret is rolled."""
    signed = f"{timestamp}.".encode() + body
    parts = [f"t={timestamp}"]
    parts += [f"v1={hmac.new(s.encode(), signed, hashlib.sha256).hexdigest()}" for s in secrets]
    return ",".join(parts)


def event_body(event: dict[str, Any]) -> bytes:
    return json.dumps(event, indent=2).encode("utf-8")


@dataclass
class OutboxEntry:
    event_id: str
    event_type: str
    created: int
    due_at: float
    auto: bool
    attempts: int = 0
    last_status: int | None = None
    last_error: str | None = None
    in_flight: bool = False


@dataclass(frozen=True)
class Delivery:
    event_id: str
    event_type: str
    attempt: int
    status: int | None
    error: str | None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


class DeliveryMixin:
    """Needs from the host: lock, store, faults, sink, webhook_secrets, auto_deliver, now(), log()."""

    def pending_events(self) -> list[dict[str, Any]]:
        with self.lock:
            return [json.loads(json.dumps(self.store.events_by_id[e.event_id])) for e in self.outbox]

    def signed_payload(self, event: dict[str, Any] | str, *, timestamp: int | None = None,
                       secrets: Iterable[str] | None = None) -> tuple[bytes, dict[str, str]]:
        if isinstance(event, str):
            event = self.store.events_by_id[event]
        body = event_body(event)
        clock = self.webhook_clock or self.now
        ts = int(clock()) if timestamp is None else int(timestamp)
        header = signature_header(body, list(self.webhook_secrets if secrets is None else secrets), ts)
        return body, {"Content-Type": "application/json; charset=utf-8", "Stripe-Signature": header,
                      "User-Agent": "Stripe/1.0 (+https://stripe.com/docs/webhooks)"}

    def deliver(self, event_id: str | None = None, *, duplicate: int = 1) -> list[Delivery]:
        """Send one event (the oldest pending if None; re-sends even an already delivered one) ``duplicate`` times."""
        with self.lock:
            if event_id is None:
                if not self.outbox:
                    return []
                event_id = self.outbox[0].event_id
            if event_id not in self.store.events_by_id:
                raise KeyError(f"no such event {event_id}")
        return self._deliver_ids([event_id], times=duplicate)

    def deliver_all(self, order: str = "created", seed: int | None = None, *,
                    include_delayed: bool = True) -> list[Delivery]:
        """Send every pending event in ``order``: created | reversed | shuffled (deterministic with ``seed``)."""
        with self.lock:
            now = self.now()
            ids = [e.event_id for e in self.outbox if include_delayed or e.due_at <= now]
        if order == "reversed":
            ids.reverse()
        elif order == "shuffled":
            random.Random(seed).shuffle(ids)
        elif order != "created":
            raise ValueError(f"unknown delivery order {order!r}")
        return self._deliver_ids(ids)

    def deliver_due(self) -> list[Delivery]:
        """Send pending events whose (delayed or back-off) due time has come, in due-time order."""
        with self.lock:
            now = self.now()
            ids = [e.event_id for e in sorted(self.outbox, key=lambda e: e.due_at) if e.due_at <= now]
        return self._deliver_ids(ids)

    # ---- internals
    def _queue(self, event: dict[str, Any]) -> None:
        delay = self.faults.take_delay()
        now = self.now()
        entry = OutboxEntry(event["id"], event["type"], event["created"], now + delay,
                            auto=self.auto_deliver and not delay)
        self.outbox.append(entry)

    def _deliver_ids(self, ids: list[str], *, times: int = 1) -> list[Delivery]:
        results: list[Delivery] = []
        with self._delivery_lock:
            for event_id in ids:
                copies = times * (2 if self.faults.take_duplicate() else 1)
                for _ in range(copies):
                    results.append(self._send(event_id))
        if self.auto_deliver:
            self._flush_auto()
        return results

    def _send(self, event_id: str) -> Delivery:
        with self.lock:
            event = self.store.events_by_id[event_id]
            entry = next((e for e in self.outbox if e.event_id == event_id), None)
            body, headers = self.signed_payload(event)
            sink = self.sink
        status: int | None = None
        error: str | None = None
        try:
            if sink is None:
                error = "no webhook sink configured"
            elif callable(sink):
                status = int(sink(body, dict(headers)))
            else:
                status = self._post(str(sink), body, headers)
        except Exception as exc:  # a broken sink is a failed delivery, never a simulator crash
            error = f"{type(exc).__name__}: {exc}"
        with self.lock:
            attempt = 1
            if entry is not None:
                entry.attempts += 1
                attempt = entry.attempts
                entry.last_status, entry.last_error = status, error
                delivery = Delivery(event_id, event["type"], attempt, status, error)
                if delivery.ok:
                    if entry in self.outbox:
                        self.outbox.remove(entry)
                else:
                    entry.auto = False
                    entry.due_at = self.now() + min(2 ** entry.attempts * 60, 3 * 3600)
            else:
                delivery = Delivery(event_id, event["type"], attempt, status, error)
            self.delivery_log.append(delivery)
        self.log(f"webhook {event['type']} {event_id} -> {status if status is not None else error}")
        return delivery

    def _post(self, url: str, body: bytes, headers: dict[str, str]) -> int:
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.webhook_timeout) as response:  # noqa: S310
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    def _flush_auto(self) -> None:
        """Deliver auto-mode events in creation order; a thread already delivering drains for everyone."""
        while True:
            if not self._delivery_lock.acquire(blocking=False):
                return
            try:
                while True:
                    with self.lock:
                        now = self.now()
                        entry = next((e for e in self.outbox if e.auto and e.attempts == 0 and e.due_at <= now),
                                     None)
                        if entry is None:
                            break
                        entry.auto = False
                    copies = 2 if self.faults.take_duplicate() else 1
                    for _ in range(copies):
                        self._send(entry.event_id)
            finally:
                self._delivery_lock.release()
            with self.lock:
                if not any(e.auto and e.attempts == 0 for e in self.outbox):
                    return
