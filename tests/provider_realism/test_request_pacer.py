"""The client-side pace shared by a process's threads (STRIPE_MAX_REQUESTS_PER_SECOND, issue 21):
slots at the rate after the burst, in the order asked, on a fake clock, and one adapter (one pacer)
however many threads ask for it at once (the adapter's threads paced under the provider's limit are
in test_adapter_rate_limit.py)."""

from __future__ import annotations

from subscriptions.providers.pacing import RequestPacer
from subscriptions.providers.registry import get_provider
from tests.support.threads import run_together


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(round(seconds, 6))


def test_the_burst_goes_at_once_then_one_slot_per_interval_in_the_order_asked():
    t = FakeTime()
    pacer = RequestPacer(4, burst=2, clock=t.clock, sleep=t.sleep)
    waits = [pacer.wait() for _ in range(5)]
    assert waits == [0.0, 0.0, 0.25, 0.5, 0.75]
    t.now += 2.0  # idle: the bucket refills up to its burst, no more
    assert [pacer.wait() for _ in range(3)] == [0.0, 0.0, 0.25]


def test_zero_does_not_pace():
    t = FakeTime()
    pacer = RequestPacer(0, clock=t.clock, sleep=t.sleep)
    assert [pacer.wait() for _ in range(50)] == [0.0] * 50 and t.slept == []


def test_threads_asking_for_the_adapter_at_once_share_one_and_its_pacer(settings):
    settings.STRIPE_MAX_REQUESTS_PER_SECOND = 7.25  # a configuration no other test has built
    adapters = run_together([get_provider] * 8)
    assert len({id(a) for a in adapters}) == 1
    assert adapters[0].pacer.rate == 7.25
