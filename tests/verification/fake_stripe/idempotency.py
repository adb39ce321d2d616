"""Idempotency keys as Stripe keeps them: the first response per key is stored with a fingerprint of
the request; the same key and fingerprint replays it, another fingerprint is an error, a key still
in flight is a 409, and keys expire after the retention window (on the simulator clock)."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qsl

NEW, REPLAY, MISMATCH, BUSY = "new", "replay", "mismatch", "busy"


def fingerprint(method: str, path: str, body: bytes, query: str = "") -> str:
    params = sorted(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
    params += sorted(parse_qsl(query, keep_blank_values=True))
    raw = json.dumps([method.upper(), path.rstrip("/"), params], separators=(",", ":"))
    return hashlib.sha256(raw.encode()).hexdigest()


@dataclass
class IdempotencyRecord:
    key: str
    fingerprint: str
    status: int
    body: bytes
    created: float


class IdempotencyStore:
    def __init__(self, clock: Callable[[], float], retention: float = 24 * 3600) -> None:
        self._clock = clock
        self.retention = retention
        self._lock = threading.Lock()
        self._records: dict[str, IdempotencyRecord] = {}
        self._in_flight: dict[str, str] = {}

    def begin(self, key: str, fp: str) -> tuple[str, IdempotencyRecord | None]:
        with self._lock:
            record = self._records.get(key)
            if record is not None and self._clock() - record.created > self.retention:
                del self._records[key]
                record = None
            if record is not None:
                return (REPLAY if record.fingerprint == fp else MISMATCH), record
            if key in self._in_flight:
                return BUSY, None
            self._in_flight[key] = fp
            return NEW, None

    def complete(self, key: str, fp: str, status: int, body: bytes) -> None:
        with self._lock:
            self._in_flight.pop(key, None)
            self._records[key] = IdempotencyRecord(key, fp, status, body, self._clock())

    def abandon(self, key: str) -> None:
        with self._lock:
            self._in_flight.pop(key, None)

    def get(self, key: str) -> IdempotencyRecord | None:
        with self._lock:
            return self._records.get(key)

    def purge_expired(self) -> int:
        with self._lock:
            now = self._clock()
            expired = [k for k, r in self._records.items() if now - r.created > self.retention]
            for key in expired:
                del self._records[key]
            return len(expired)
