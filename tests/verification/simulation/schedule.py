"""The random schedule of a simulation run: plain data, generated up front from one seed.

Every random choice of a run is drawn here from ``random.Random(seed)``; executing a step
only reads the numbers stored on it (``a``, ``b``, ``n``), so any prefix or subset of a
schedule replays deterministically (the shrinker relies on this).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

PRICES = {
    "standard": ("price_monthly_pro", "month", 4900),  # standard-monthly@6: provider retries
    "local": ("price_monthly_local", "month", 2900),  # local-retry-monthly@1: LOCAL retries
    "annual": ("price_annual_pro", "year", 49000),  # annual-no-grace@1
}
PLAN_OF_PRICE = {price: plan for plan, (price, _, _) in PRICES.items()}
PROVIDER_PLANS = ("standard", "annual")  # the provider owns retries (retryAuthority PAYMENT_PROVIDER)

DAY = 86400
# The provider's own retry schedule for a run (seconds between automatic attempts, tries in all):
# the simulator's default (Stripe's classic 3/5/7 days, 4 tries), or Smart-Retries-like, 8 tries
# spread over 14 days: most of them after a P7D grace has ended (SPEC §5: grace is a deadline).
PROVIDER_RETRIES: dict[str, tuple[tuple[int, ...], int]] = {
    "stripe-default": ((3 * DAY, 5 * DAY, 7 * DAY), 4),
    "smart-14d": ((DAY, DAY, 2 * DAY, 2 * DAY, 2 * DAY, 3 * DAY, 3 * DAY), 8),
}

# step kind -> weight
WEIGHTS: dict[str, int] = {
    "advance": 16,  # the clock moves; the provider and the scheduler act on due work
    "renewal": 6,  # a new period's invoice, charged by the provider at once
    "set_card": 6,  # the customer's card starts to decline (random code, hard ones included) or works again
    "soft_decline": 2,  # a provider-retry plan's renewal declines retryably: the provider's schedule outlasts grace
    "customer_pays": 5,
    "boundary_pay": 2,  # the customer pays exactly at the grace deadline
    "deliver": 12,  # pending webhooks in created / reversed / shuffled order
    "deliver_one": 6,  # one pending webhook (the rest stay out of order)
    "duplicate": 4,  # the next deliveries arrive twice
    "redeliver_old": 3,  # an already delivered event is sent again (late duplicate)
    "delay": 3,  # hold the next events for minutes to days
    "pay_fault": 4,  # POST /v1/invoices/*/pay: applied, but the answer is lost (500 or timeout)
    "reschedule": 3,  # the provider moves its next attempt
    "outage": 1,  # the scheduler is down for a few simulated days
    "crash": 3,  # the next local retry crashes at a recovery point
    "retry_now": 3,  # the customer presses "retry now"
    "mark_uncollectible": 2,
    "void": 2,
    "refund": 2,
    "dispute": 2,  # a chargeback on a paid invoice (often after restriction of another)
    "close_dispute": 2,
    "outbox_replay": 2,  # the relay re-sends published messages (at-least-once)
    "stale_read": 2,  # the provider's next read of an invoice is one version old
    "exception": 3,  # support grants an expiring exception
    "jobs": 4,  # every job once now (a manual run_jobs)
    # the contract line (the provider subscription itself)
    "cancel": 1,  # the customer cancels at the provider: at once, or at the period end
    "end_period": 1,  # a period set to cancel at its end runs out (the clock moves there when it is near)
    "resubscribe": 1,  # a customer whose subscription ended subscribes again
    "pause": 1,  # collection paused at the provider (void / keep as draft / mark uncollectible), maybe until a date
    "resume": 1,
    "change_plan": 1,  # a price / interval change at the provider, preferably while an invoice is in dunning
    "staff_cancel": 1,  # a billing lead cancels a restricted cycle (the provider is told through the outbox)
    "cancel_fault": 1,  # the provider's DELETE /v1/subscriptions/* fails for a while
    "jobs_ahead": 1,  # every job asked at a `now` days after the trusted clock: must change nothing
}
DECLINES = ("insufficient_funds", "insufficient_funds", "processing_error", "expired_card",
            "authentication_required", "stolen_card", "lost_card", "revocation_of_authorization", "fraudulent")


@dataclass(frozen=True)
class Step:
    kind: str
    a: float = 0.0
    b: float = 0.0
    n: int = 0

    def __str__(self) -> str:
        return f"{self.kind}(a={self.a:.4f}, b={self.b:.4f}, n={self.n})"

    def as_tuple(self) -> tuple[str, float, float, int]:
        return (self.kind, round(self.a, 6), round(self.b, 6), self.n)


@dataclass(frozen=True)
class Schedule:
    seed: int
    plans: tuple[str, ...]  # one PRICES key per subscription
    steps: tuple[Step, ...] = field(default_factory=tuple)
    provider_retries: str = "stripe-default"  # a PROVIDER_RETRIES key: the simulator's retry schedule this run

    def with_steps(self, steps: list[Step] | tuple[Step, ...]) -> Schedule:
        return replace(self, steps=tuple(steps))

    def as_python(self) -> str:
        """The schedule as a literal a test can paste (``Schedule(...)``)."""
        steps = ",\n    ".join(f"Step({s.kind!r}, {s.a!r}, {s.b!r}, {s.n!r})" for s in self.steps)
        return (f"Schedule(seed={self.seed}, plans={self.plans!r}, provider_retries={self.provider_retries!r}, "
                f"steps=(\n    {steps},\n))")


def generate(seed: int, steps: int, *, subscriptions: int | None = None) -> Schedule:
    rng = random.Random(seed)
    count = subscriptions or rng.randint(2, 3)
    plans = tuple(rng.choice(("standard", "standard", "local", "local", "annual")) for _ in range(count))
    retries = "smart-14d" if rng.random() < 0.5 else "stripe-default"
    kinds, weights = zip(*WEIGHTS.items(), strict=True)
    chosen = rng.choices(kinds, weights=weights, k=steps)
    return Schedule(seed, plans, tuple(Step(k, rng.random(), rng.random(), rng.randint(1, 3)) for k in chosen),
                    provider_retries=retries)
