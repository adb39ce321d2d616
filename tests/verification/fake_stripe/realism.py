"""Network realism for the simulator: a real provider's per-call latency and its request-rate limit.

Off by default (``NetworkProfile()``: no latency, no limit), so every test that does not ask for it
sees the simulator answer in microseconds, as before. Switch it on with
``StripeSimulator(network=NetworkProfile.stripe_test())``, ``sim.network.configure(...)``,
``POST /_sim/realism`` or ``python -m tests.verification.fake_stripe --latency-ms 150
--latency-spread-ms 50 --rate-limit 25``.

Latency: each ``/v1/`` request draws one figure from a normal distribution (mean ``latency_ms``,
standard deviation ``latency_spread_ms``) clipped to mean ± 2 spreads and at 0, from a
``random.Random(seed)``: sequential calls replay exactly; concurrent calls draw in the order the
server's threads reach the generator. Half of it is spent before the request is looked at (the way
in), half after its answer is made (the way out), both outside the simulator's lock, so requests in
flight overlap as they do at a real provider. A 429 costs the same round trip.

Rate limit: Stripe's limiter is a token bucket per account, reads (GET) and writes (POST, DELETE)
counted apart: about 100 operations a second each in live mode, 25 in test mode. Beyond it Stripe
answers HTTP 429 with ``{"error": {"type": "invalid_request_error", "code": "rate_limit", ...}}`` and a
``Stripe-Rate-Limited-Reason`` header (``global-rate`` here), and no ``Retry-After`` and no
``Stripe-Should-Retry``: the official SDKs deliberately do not retry a rate-limit 429 (only the
``lock_timeout`` kind), the caller is meant to back off. ``retry_after`` makes the simulator send a
``Retry-After`` anyway, to exercise a client that honours one. The buckets run on the real
monotonic clock, never the simulator's (which tests freeze and move).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from tests.verification.fake_stripe.errors import SimError

RATE_LIMIT_MESSAGE = ("Request rate limit exceeded. You can learn more about rate limits here "
                      "https://stripe.com/docs/rate-limits.")
RATE_LIMITED_REASON = "global-rate"
# Stripe's published limits (operations a second, reads and writes each): live and test mode.
LIVE_RATE, TEST_RATE = 100.0, 25.0
# A round trip to api.stripe.com as the issue describes it: 150 ms ± 50 ms.
TYPICAL_LATENCY_MS, TYPICAL_SPREAD_MS = 150.0, 50.0


@dataclass(frozen=True)
class NetworkProfile:
    """How far the simulator behaves like a provider across a network. All off by default."""

    latency_ms: float = 0.0
    latency_spread_ms: float = 0.0  # standard deviation; draws are clipped to latency_ms ± 2 spreads, and ≥ 0
    read_rate: float | None = None  # GET requests a second; None: unlimited
    write_rate: float | None = None  # POST / DELETE requests a second; None: unlimited
    burst: float | None = None  # bucket size (requests taken at once); None: one second's worth of the rate
    retry_after: float | None = None  # send "Retry-After: <s>" with each 429 (real Stripe sends none)
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("latency_ms", "latency_spread_ms", "retry_after"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be ≥ 0")
        for name in ("read_rate", "write_rate", "burst"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0 (None switches it off)")

    @classmethod
    def stripe_live(cls, **overrides: Any) -> NetworkProfile:
        """Live mode: 100 reads and 100 writes a second, 150 ms ± 50 ms."""
        return replace(cls(TYPICAL_LATENCY_MS, TYPICAL_SPREAD_MS, LIVE_RATE, LIVE_RATE), **overrides)

    @classmethod
    def stripe_test(cls, **overrides: Any) -> NetworkProfile:
        """Test mode: 25 reads and 25 writes a second, 150 ms ± 50 ms."""
        return replace(cls(TYPICAL_LATENCY_MS, TYPICAL_SPREAD_MS, TEST_RATE, TEST_RATE), **overrides)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> NetworkProfile:
        presets = {"off": cls, "live": cls.stripe_live, "test": cls.stripe_test}
        if name not in presets:
            raise ValueError(f"unknown network preset {name!r}; known: {', '.join(presets)}")
        return presets[name](**overrides)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NetworkProfile:
        """A profile from JSON (the control API): an optional ``preset`` plus any fields."""
        names = {f.name for f in fields(cls)}
        unknown = set(data) - names - {"preset"}
        if unknown:
            raise ValueError(f"unknown network setting(s): {', '.join(sorted(unknown))}")
        overrides = {k: (None if v is None else int(v) if k == "seed" else float(v))
                     for k, v in data.items() if k in names}
        return cls.preset(str(data.get("preset", "off")), **overrides)

    @property
    def enabled(self) -> bool:
        return bool(self.latency_ms or self.latency_spread_ms or self.read_rate or self.write_rate)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class TokenBucket:
    """``rate`` tokens a second up to ``capacity``; a request takes one or is refused."""

    def __init__(self, rate: float, capacity: float, now: float) -> None:
        self.rate = rate
        self.capacity = capacity
        self.tokens = capacity
        self.stamp = now

    def take(self, now: float) -> bool:
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class NetworkConditions:
    """The simulator's live network state: the profile, its seeded generator, the buckets, counters.
    Thread-safe with its own small lock (never held while sleeping, never the simulator's lock)."""

    def __init__(self, profile: NetworkProfile | None = None, *,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._monotonic = monotonic
        self.configure(profile or NetworkProfile())

    def configure(self, profile: NetworkProfile) -> NetworkProfile:
        """Switch to ``profile``: the generator is reseeded, the buckets are full, counters reset."""
        with self._lock:
            self.profile = profile
            self._random = random.Random(profile.seed)
            now = self._monotonic()
            self._buckets = {kind: TokenBucket(rate, profile.burst or max(1.0, rate), now)
                             for kind, rate in (("read", profile.read_rate), ("write", profile.write_rate)) if rate}
            self.counts = {"read": 0, "write": 0, "rate_limited_read": 0, "rate_limited_write": 0}
            self.latency_seconds_total = 0.0
        return profile

    def draw_latency(self) -> float:
        """One call's round trip, in seconds."""
        with self._lock:
            mean, spread = self.profile.latency_ms, self.profile.latency_spread_ms
            if not mean and not spread:
                return 0.0
            ms = self._random.gauss(mean, spread) if spread else mean
            ms = min(max(ms, mean - 2 * spread, 0.0), mean + 2 * spread)
            self.latency_seconds_total += ms / 1000
            return ms / 1000

    def admit(self, method: str) -> bool:
        """Count one request; False when its bucket is empty (answer 429)."""
        kind = "read" if method.upper() in ("GET", "HEAD") else "write"
        with self._lock:
            self.counts[kind] += 1
            bucket = self._buckets.get(kind)
            if bucket is None or bucket.take(self._monotonic()):
                return True
            self.counts[f"rate_limited_{kind}"] += 1
            return False

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"profile": self.profile.as_dict(), "enabled": self.profile.enabled, **self.counts,
                    "latency_seconds_total": round(self.latency_seconds_total, 6)}


def rate_limit_answer(retry_after: float | None = None) -> tuple[int, dict[str, Any], dict[str, str]]:
    """Status, body and headers of Stripe's rate-limit answer."""
    headers = {"Stripe-Rate-Limited-Reason": RATE_LIMITED_REASON}
    if retry_after is not None:
        headers["Retry-After"] = f"{retry_after:g}"
    return 429, SimError(429, RATE_LIMIT_MESSAGE, code="rate_limit").body(), headers
