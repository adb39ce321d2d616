"""Seeded schedules for the Alipay simulation: the agreements a run starts with and the steps it
takes, generated from the seed alone (never from the world's state), so a seed always replays the
same run. A step names an agreement by its index; its handler decides at run time what that means
(the oldest waiting trade of that agreement, ...) and does nothing when there is nothing to act on.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

PLAN = "alipay_monthly"
AMOUNT_FEN = 3000  # settings.ALIPAY_PLANS["alipay_monthly"]
PAY = "alipay.trade.pay"
QUERY = "alipay.trade.query"
GATEWAY_FAULT_KINDS = ("timeout", "timeout", "system_error", "http_502", "tamper", "in_progress", "in_progress")
FAULT_METHODS = (PAY, PAY, PAY, QUERY, "*")

# kind -> weight. `advance_*` move the clock (the scheduler runs every job on its cadence on the way);
# the others act on the simulator, on the notification flow or on the scheduler itself.
WEIGHTS: dict[str, float] = {
    "advance_minutes": 14, "advance_hours": 12, "advance_days": 7, "balance": 8, "revoke": 1.2,
    "gateway_fault": 7, "settle_trade": 4, "finish_trade": 1.5, "notify_fault": 4, "relay": 6,
    "outage": 1.5, "catch_up": 2, "hostile": 1.5,
}


@dataclass(frozen=True)
class Step:
    kind: str
    args: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.kind}({', '.join(f'{k}={v!r}' for k, v in self.args.items())})"


@dataclass(frozen=True)
class Agreement:
    balance_fen: int
    period_ends_in: int  # seconds after the run's start when its first renewal comes due


@dataclass
class Schedule:
    seed: int
    agreements: list[Agreement]
    steps: list[Step]

    def as_python(self) -> str:
        lines = [f"Schedule(seed={self.seed}, agreements={self.agreements!r}, steps=["]
        lines += [f"    Step({s.kind!r}, {s.args!r})," for s in self.steps]
        return "\n".join([*lines, "])"])


def _balance(rng: random.Random) -> int:
    """Low (cannot cover one renewal), exactly one renewal, or plenty."""
    return rng.choice((0, rng.randrange(0, AMOUNT_FEN), AMOUNT_FEN, rng.randrange(10_000, 50_000),
                       rng.randrange(10_000, 50_000)))


def _step(rng: random.Random, kind: str, agreements: int) -> Step:
    k = rng.randrange(agreements)
    deliver = rng.random() < 0.75  # the simulator's due notifications reach us on the way, or queue
    match kind:
        case "advance_minutes":
            return Step(kind, {"seconds": rng.randrange(5, 91) * 60, "deliver": deliver})
        case "advance_hours":
            return Step(kind, {"seconds": rng.randrange(1, 15) * 3600, "deliver": deliver})
        case "advance_days":
            return Step(kind, {"seconds": rng.randrange(1, 4) * 86400, "deliver": deliver})
        case "balance":
            return Step(kind, {"agreement": k, "fen": _balance(rng)})
        case "revoke":
            return Step(kind, {"agreement": k})
        case "gateway_fault":
            fault = rng.choice(GATEWAY_FAULT_KINDS)
            method = PAY if fault == "in_progress" else rng.choice(FAULT_METHODS)
            return Step(kind, {"fault": fault, "method": method, "apply": rng.random() < 0.5,
                               "count": rng.choice((1, 1, 2))})
        case "settle_trade":
            return Step(kind, {"agreement": k, "success": rng.random() < 0.7})
        case "finish_trade":
            return Step(kind, {"agreement": k})
        case "notify_fault":
            fault = rng.choice(("duplicate", "delay", "drop"))
            args: dict[str, Any] = {"fault": fault, "count": rng.choice((1, 1, 2))}
            if fault == "delay":
                args["seconds"] = rng.randrange(1, 121) * 60
            return Step(kind, args)
        case "relay":
            return Step(kind)
        case "outage":
            return Step(kind, {"seconds": rng.randrange(1, 13) * 1800})
        case "catch_up":
            return Step(kind, {"back": rng.randrange(1, 361) * 60})
        case "hostile":
            return Step(kind, {"variant": rng.choice(("bad_signature", "wrong_amount", "foreign_app"))})
    raise ValueError(kind)


def generate(seed: int, steps: int, *, agreements: int | None = None) -> Schedule:
    rng = random.Random(f"alipay-sim-{seed}")
    count = agreements or rng.randrange(4, 9)
    # First renewals come due within the first days, staggered, so most steps have something to act on.
    starts = [Agreement(_balance(rng), rng.randrange(2 * 3600, 6 * 86400)) for _ in range(count)]
    kinds, weights = zip(*WEIGHTS.items(), strict=True)
    return Schedule(seed, starts, [_step(rng, rng.choices(kinds, weights)[0], count) for _ in range(steps)])
