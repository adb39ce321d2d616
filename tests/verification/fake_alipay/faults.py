"""Faults armed on demand. Gateway faults fire for the next N calls of one method (``"*"``: any
method); notification faults (duplicate, delay, drop) for the next N notifications created."""

from __future__ import annotations

import threading
from dataclasses import dataclass

# timeout: the connection is held ``hold_seconds`` then closed without an answer. With apply=True the
#   call took effect first ("charged, then the answer was lost"); with apply=False nothing happened.
# system_error: a signed 20000 ACQ.SYSTEM_ERROR (apply as above).
# http_502: a bare HTTP 502 from the load balancer (apply as above).
# tamper: the signed answer is altered after signing (total_amount / msg changed): the signature fails.
# in_progress: alipay.trade.pay answers 10003 and the trade waits (WAIT_BUYER_PAY) until settled.
GATEWAY_FAULTS = ("timeout", "system_error", "http_502", "tamper", "in_progress")


@dataclass
class GatewayFault:
    kind: str
    method: str
    remaining: int
    apply: bool = False
    hold_seconds: float = 2.0
    fired: int = 0


class AlipayFaults:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._gateway: list[GatewayFault] = []
        self._duplicate = 0
        self._drop = 0
        self._delay_count = 0
        self._delay_seconds = 0.0

    def arm(self, kind: str, method: str = "*", *, count: int = 1, apply: bool = False,
            hold_seconds: float = 2.0) -> GatewayFault:
        if kind not in GATEWAY_FAULTS:
            raise ValueError(f"unknown gateway fault {kind!r}; one of {GATEWAY_FAULTS}")
        fault = GatewayFault(kind, method, int(count), apply=bool(apply), hold_seconds=float(hold_seconds))
        with self._lock:
            self._gateway.append(fault)
        return fault

    def duplicate_notifications(self, count: int = 1) -> None:
        """Every delivery attempt of the next ``count`` notifications is sent twice (same notify_id)."""
        with self._lock:
            self._duplicate += count

    def drop_notifications(self, count: int = 1) -> None:
        """The next ``count`` notifications are never sent (logged as dropped)."""
        with self._lock:
            self._drop += count

    def delay_notifications(self, seconds: float, count: int = 1) -> None:
        """The first delivery of the next ``count`` notifications is due ``seconds`` later (simulator clock)."""
        with self._lock:
            self._delay_seconds, self._delay_count = float(seconds), int(count)

    def clear(self) -> None:
        with self._lock:
            self._gateway.clear()
            self._duplicate = self._drop = self._delay_count = 0
            self._delay_seconds = 0.0

    @property
    def armed(self) -> list[GatewayFault]:
        with self._lock:
            return [f for f in self._gateway if f.remaining > 0]

    # ---- consuming
    def take(self, method: str, kinds: tuple[str, ...] = GATEWAY_FAULTS) -> GatewayFault | None:
        with self._lock:
            for fault in self._gateway:
                if fault.remaining > 0 and fault.kind in kinds and fault.method in (method, "*"):
                    fault.remaining -= 1
                    fault.fired += 1
                    return fault
        return None

    def take_notification_faults(self) -> tuple[bool, bool, float]:
        """(duplicate, drop, delay seconds) for one new notification."""
        with self._lock:
            duplicate, drop, delay = self._duplicate > 0, self._drop > 0, 0.0
            self._duplicate -= duplicate
            self._drop -= drop
            if self._delay_count > 0:
                self._delay_count -= 1
                delay = self._delay_seconds
            return duplicate, drop, delay
