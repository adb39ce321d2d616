"""The random schedule of an AgentPay simulation run: plain data, drawn up front from one seed.

Every random choice is made here with ``random.Random(seed)``; executing a step only reads the
numbers stored on it (``a``, ``b``, ``n``, ``what``), so a run replays exactly from its seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

# Upstream behaviours of a call (tests/verification/agentpay_sim/upstream.py) → weight.
ANSWERS = {"ok": 10, "bad": 3, "boom": 2, "sick": 2, "hang": 1, "drop": 1}
# Where a crash can hit: after which committed acceptance (or HTTP answer) the process dies.
CRASH_POINTS = (
    "intent.payload_verified",  # authorized, no hold yet
    "settlement.hold_acquired",  # held, not dispatched
    "fulfillment.dispatch",  # dispatched, the upstream never called
    "forward",  # the upstream answered (and acted or not); nothing recorded
    "answer",  # the answer committed, the agent never hears it
    "status_query",  # a status-query answer came back; nothing recorded
    "job_accept",  # a job's first acceptance committed; the rest of its batch not run
)
JOBS = ("agentpay_fulfillment_status_query", "agentpay_recovery_deadline", "agentpay_challenge_expiry",
        "agentpay_outbox_relay", "agentpay_hold_expiry")
ADVANCES = (1, 5, 30, 90, 300, 600, 1200)  # seconds the clock moves (jobs do not run: they come late)

WEIGHTS: dict[str, int] = {
    "call": 30,  # an agent pays for a call under a fresh key
    "replay": 8,  # an agent sends a used key again, same request (retry after a crash, a timeout, …)
    "reuse": 2,  # a used key with a different body: 422
    "burst": 3,  # n threads send one fresh key at once
    "crowd": 3,  # n threads on the hot wallet, distinct keys, at once
    "crash": 8,  # the next call or job dies at a crash point
    "advance": 12,
    "job": 12,  # one job, at the clock (late: the clock moved without it)
    "job_past": 3,  # a catch-up run with a `now` in the past
    "job_ahead": 2,  # a run with a `now` ahead of the trusted clock: must change nothing
    "jobs_race": 2,  # two workers run the status-query job at once
    "status_faults": 3,  # the upstream's status endpoint answers 500 for a while
    "review": 5,  # a billing lead resolves one needs-review intent, from the upstream's log
    "topup": 3,  # a staff credit into a wallet
}


@dataclass(frozen=True)
class Step:
    kind: str
    a: int = 0  # which tenant / key / job / intent (modulo what exists)
    b: int = 0
    n: int = 1
    what: str = ""  # an upstream behaviour, a crash point, a job name

    def __str__(self) -> str:
        return f"{self.kind}(a={self.a}, b={self.b}, n={self.n}, what={self.what!r})"


@dataclass(frozen=True)
class Schedule:
    seed: int
    tenants: int
    balances: tuple[int, ...]
    steps: tuple[Step, ...] = field(default_factory=tuple)
    # Every n-th key's agent never sends it again (no replay, no retry at the end): what a crash
    # leaves behind stays as it is unless a job ends it. 0: every agent retries.
    abandon_every: int = 0


def _answer(rng: random.Random) -> str:
    return rng.choices(list(ANSWERS), weights=list(ANSWERS.values()))[0]


def generate(seed: int, steps: int, *, concurrency: bool = True) -> Schedule:
    rng = random.Random(seed)
    tenants = rng.randint(2, 4)
    # Tenant 0 is the hot wallet; the others are small enough to run dry now and then.
    balances = (rng.randint(3000, 6000), *(rng.randint(300, 1500) for _ in range(tenants - 1)))
    kinds = {k: w for k, w in WEIGHTS.items() if concurrency or k not in ("burst", "crowd", "jobs_race")}
    out: list[Step] = []
    for _ in range(steps):
        kind = rng.choices(list(kinds), weights=list(kinds.values()))[0]
        a, b = rng.randrange(1 << 30), rng.randrange(1 << 30)
        if kind in ("call", "burst", "crowd"):
            out.append(Step(kind, a, b, n=rng.randint(3, 8), what=_answer(rng)))
        elif kind == "crash":
            out.append(Step(kind, a, b, what=rng.choice(CRASH_POINTS)))
        elif kind == "advance":
            out.append(Step(kind, a, b, n=rng.choice(ADVANCES)))
        elif kind in ("job", "job_past", "job_ahead"):
            out.append(Step(kind, a, b, n=rng.choice(ADVANCES), what=rng.choice(JOBS)))
        elif kind == "status_faults":
            out.append(Step(kind, a, b, n=rng.randint(1, 4)))
        elif kind == "topup":
            out.append(Step(kind, a, b, n=rng.randint(200, 2000)))
        else:
            out.append(Step(kind, a, b))
    # Drawn after the steps, so a seed's steps are the same as before agents could give up.
    abandon_every = rng.choice((2, 3, 4))
    return Schedule(seed=seed, tenants=tenants, balances=balances, steps=tuple(out), abandon_every=abandon_every)
