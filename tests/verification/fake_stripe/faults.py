"""Faults armed on demand: request faults matched by ``"METHOD /path/with/*"`` patterns, stale reads,
and webhook delivery faults (duplicates, delays). Each request fault fires for the next N matches."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field


def compile_pattern(pattern: str) -> tuple[str | None, re.Pattern[str]]:
    """``"POST /v1/invoices/*/pay"`` → (method, regex); ``*`` is one path segment, ``**`` any suffix."""
    method, _, path = pattern.strip().partition(" ")
    if not path:
        method, path = "", method
    regex = ""
    for token in re.split(r"(\*\*|\*)", path.strip()):
        regex += ".*" if token == "**" else "[^/]+" if token == "*" else re.escape(token)
    return (method.upper() or None), re.compile(f"^{regex}/?$")


@dataclass
class Fault:
    kind: str  # timeout | error_500 | latency | rate_limit
    pattern: str
    remaining: int
    apply: bool = True
    seconds: float = 0.0
    retry_after: float | None = None  # rate_limit: the Retry-After header to send, if any
    fired: int = 0
    method: str | None = field(default=None, repr=False)
    regex: re.Pattern[str] | None = field(default=None, repr=False)

    def matches(self, method: str, path: str) -> bool:
        return (self.method is None or self.method == method.upper()) and bool(self.regex and self.regex.match(path))


class FaultInjector:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self._stale: dict[str, int] = {}
        self._duplicates = 0
        self.delay_seconds = 0.0
        self._delay_count: int | None = None

    # ---- arming
    def timeout(self, pattern: str, *, apply: bool = True, hold_seconds: float = 5.0, count: int = 1) -> Fault:
        """The request hangs ``hold_seconds`` and the connection is closed without a response.
        ``apply=True``: the operation IS applied first (the indeterminate case)."""
        return self._arm(Fault("timeout", pattern, count, apply=apply, seconds=hold_seconds))

    def error_500(self, pattern: str, *, apply: bool = True, count: int = 1) -> Fault:
        """HTTP 500 ``api_error``; with ``apply=True`` after the operation was applied (and its success
        stored under the idempotency key, so a retry with the same key replays the success)."""
        return self._arm(Fault("error_500", pattern, count, apply=apply))

    def latency(self, pattern: str, seconds: float, *, count: int = 1) -> Fault:
        """Slow processing: sleeps ``seconds`` before applying, while the idempotency key is in flight."""
        return self._arm(Fault("latency", pattern, count, seconds=seconds))

    def rate_limit(self, pattern: str, *, count: int = 1, retry_after: float | None = None) -> Fault:
        """HTTP 429 ``rate_limit`` before anything is done (as Stripe's limiter answers), with a
        ``Retry-After`` header only when ``retry_after`` is given (real Stripe sends none)."""
        return self._arm(Fault("rate_limit", pattern, count, apply=False, retry_after=retry_after))

    def stale_read(self, object_id: str, count: int = 1) -> None:
        """The next ``count`` GETs of the object return the version before its latest change."""
        with self._lock:
            self._stale[object_id] = self._stale.get(object_id, 0) + count

    def duplicate_next_delivery(self, n: int = 1) -> None:
        """The next ``n`` webhook deliveries are each sent twice."""
        with self._lock:
            self._duplicates += n

    def delay_deliveries(self, seconds: float, count: int | None = None) -> None:
        """Hold the next ``count`` events (all, if None) for ``seconds``; ``deliver_due()`` sends them later.
        ``delay_deliveries(0)`` stops delaying."""
        with self._lock:
            self.delay_seconds = float(seconds)
            self._delay_count = count if seconds else None

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()
            self._stale.clear()
            self._duplicates = 0
            self.delay_seconds = 0.0
            self._delay_count = None

    @property
    def armed(self) -> list[Fault]:
        with self._lock:
            return [f for f in self._faults if f.remaining > 0]

    # ---- consuming
    def take(self, method: str, path: str, kinds: tuple[str, ...] = ("timeout", "error_500")) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.kind in kinds and fault.remaining > 0 and fault.matches(method, path):
                    fault.remaining -= 1
                    fault.fired += 1
                    return fault
        return None

    def take_stale(self, object_id: str) -> bool:
        with self._lock:
            left = self._stale.get(object_id, 0)
            if left <= 0:
                return False
            self._stale[object_id] = left - 1
            return True

    def take_duplicate(self) -> bool:
        with self._lock:
            if self._duplicates <= 0:
                return False
            self._duplicates -= 1
            return True

    def take_delay(self) -> float:
        with self._lock:
            if self.delay_seconds <= 0:
                return 0.0
            if self._delay_count is not None:
                if self._delay_count <= 0:
                    return 0.0
                self._delay_count -= 1
            return self.delay_seconds

    def _arm(self, fault: Fault) -> Fault:
        fault.method, fault.regex = compile_pattern(fault.pattern)
        with self._lock:
            self._faults.append(fault)
        return fault
