"""The client-side pace shared by a process's threads (STRIPE_MAX_REQUESTS_PER_SECOND, issue 21):
slots at the rate after the burst, in the order asked, and threads paced under the provider's limit
get no 429. The bucket's arithmetic runs on a fake clock; the threads on real HTTP to the simulator."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from subscriptions.providers.pacing import RequestPacer
from subscriptions.providers.stripe_adapter import StripeProvider
from tests.support.threads import run_together
from tests.verification.fake_stripe import StripeSimulator
from tests.verification.fake_stripe.realism import NetworkProfile


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


@pytest.fixture
def sim() -> Iterator[StripeSimulator]:
    simulator = StripeSimulator()
    simulator.start()
    yield simulator
    simulator.stop()


def test_threads_sharing_a_paced_adapter_stay_under_the_providers_limit(sim):
    cus = sim.create_customer("ada@example.com", card="ok")
    invoice = sim.get(sim.create_subscription(cus, "price_monthly_pro", amount=2500))["latest_invoice"]
    sim.network.configure(NetworkProfile(read_rate=4, write_rate=4, burst=6))  # slack for a late thread
    adapter = StripeProvider(api_key="sk_test_local", api_base=sim.base_url, webhook_secrets=["whsec_local"],
                             account="acct_demo", timeout=5.0, rate_limit_retry_seconds=0,
                             max_requests_per_second=3)
    assert adapter.pacer.burst == 3

    fetched = run_together([lambda: [adapter.fetch_invoice(invoice).id for _ in range(3)]] * 4, timeout=60)

    assert fetched == [[invoice] * 3] * 4
    stats = sim.network.stats()
    assert (stats["read"], stats["rate_limited_read"]) == (12, 0)
