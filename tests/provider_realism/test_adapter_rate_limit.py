"""The Stripe adapter under Stripe's rate limit (issue 21 item 1): it tries again through HTTP 429
(Retry-After when sent, else back-off with jitter), within a time budget; past it the call is
indeterminate and says it was rate-limited, how many tries and how long. A write is only ever
tried again under its own idempotency key, and is never charged twice. Real SDK, real HTTP on
loopback, the simulator's limiter and its ``rate_limit`` fault; no mocks."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator

import pytest

from subscriptions.providers.base import ProviderIndeterminate
from subscriptions.providers.stripe_adapter import StripeProvider
from tests.support.threads import run_together
from tests.verification.fake_stripe import StripeSimulator
from tests.verification.fake_stripe.realism import NetworkProfile

READ = "GET /v1/invoices/*"
PAY = "POST /v1/invoices/*/pay"


@pytest.fixture
def sim() -> Iterator[StripeSimulator]:
    simulator = StripeSimulator()
    simulator.start()
    yield simulator
    simulator.stop()


def provider(sim: StripeSimulator, budget: float = 10.0, backoff: tuple[float, float] = (0.05, 0.2),
             max_requests_per_second: float = 0.0) -> StripeProvider:
    return StripeProvider(api_key="sk_test_local", api_base=sim.base_url, webhook_secrets=["whsec_local"],
                          account="acct_demo", timeout=5.0, rate_limit_retry_seconds=budget, rate_limit_backoff=backoff,
                          max_requests_per_second=max_requests_per_second)


def open_renewal(sim: StripeSimulator, card: str = "ok", amount: int = 2500) -> str:
    cus = sim.create_customer("ada@example.com", card=card)
    sub = sim.create_subscription(cus, "price_monthly_pro", amount=amount)
    return sim.create_renewal_invoice(sub)


def tries_in(message: str) -> int:
    return int(re.search(r"(\d+) tr(?:y|ies) in", message).group(1))


def test_a_read_is_tried_again_through_429s_and_succeeds(sim):
    invoice = open_renewal(sim)
    fault = sim.faults.rate_limit(READ, count=3)
    started = time.monotonic()
    fetched = provider(sim).fetch_invoice(invoice)
    elapsed = time.monotonic() - started
    assert fetched.id == invoice and fault.fired == 3
    assert elapsed >= 0.025 + 0.05 + 0.1 - 0.01  # back-off 0.05, 0.1, 0.2 s, each at least halved by jitter
    assert elapsed < 5.0


def test_retry_after_is_honoured(sim):
    invoice = open_renewal(sim)
    sim.faults.rate_limit(READ, count=2, retry_after=0.3)
    started = time.monotonic()
    assert provider(sim, backoff=(0.001, 0.001)).fetch_invoice(invoice).id == invoice
    elapsed = time.monotonic() - started
    assert 0.6 <= elapsed < 5.0


def test_past_the_budget_the_read_is_indeterminate_and_says_why(sim):
    invoice = open_renewal(sim)
    fault = sim.faults.rate_limit(READ, count=1000)
    started = time.monotonic()
    with pytest.raises(ProviderIndeterminate) as raised:
        provider(sim, budget=1.0, backoff=(0.1, 0.4)).fetch_invoice(invoice)
    elapsed = time.monotonic() - started
    message = str(raised.value)
    assert "Stripe rate-limited the request (HTTP 429 rate_limit, global-rate)" in message
    assert "1 s rate-limit budget" in message
    assert tries_in(message) == fault.fired and fault.fired >= 3
    assert 0.3 <= elapsed < 1.0 + 2.0  # never sleeps past the budget (slack for a loaded machine)


def test_a_retry_after_beyond_the_budget_gives_up_at_once(sim):
    invoice = open_renewal(sim)
    sim.faults.rate_limit(READ, count=5, retry_after=30)
    started = time.monotonic()
    with pytest.raises(ProviderIndeterminate, match=r"1 try in .* \(Stripe asked to wait 30 s more\)"):
        provider(sim, budget=5.0).fetch_invoice(invoice)
    assert time.monotonic() - started < 2.0


def test_a_zero_budget_never_waits(sim):
    invoice = open_renewal(sim)
    sim.faults.rate_limit(READ, count=5)
    with pytest.raises(ProviderIndeterminate, match="1 try in"):
        provider(sim, budget=0).fetch_invoice(invoice)


def test_reads_ride_out_the_token_bucket(sim):
    invoice = open_renewal(sim)
    sim.network.configure(NetworkProfile(read_rate=5, burst=2))
    adapter = provider(sim)
    started = time.monotonic()
    for _ in range(8):
        assert adapter.fetch_invoice(invoice).id == invoice
    elapsed = time.monotonic() - started
    stats = sim.network.stats()
    assert stats["rate_limited_read"] >= 1
    assert stats["read"] - stats["rate_limited_read"] == 8
    assert elapsed >= 1.0  # 2 at once, then 5 a second for the other 6


def test_concurrent_readers_all_get_through_a_realistic_profile(sim):
    invoice = open_renewal(sim)
    sim.network.configure(NetworkProfile.stripe_test(latency_ms=100, latency_spread_ms=30, read_rate=10, burst=3))
    adapter = provider(sim, backoff=(0.1, 0.5))
    results: list[object] = []

    def read() -> None:
        try:
            results.append(adapter.fetch_invoice(invoice).id)
        except Exception as exc:  # kept for the assertion
            results.append(exc)

    threads = [threading.Thread(target=read) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert results == [invoice] * 12
    assert sim.network.stats()["rate_limited_read"] >= 1


def test_a_write_under_429_is_tried_again_under_its_key_and_charged_once(sim):
    invoice = open_renewal(sim)
    fault = sim.faults.rate_limit(PAY, count=2)
    adapter = provider(sim)
    outcome = adapter.pay_invoice(invoice, idempotency_key="pay-in-1")
    assert outcome.invoice.status == "paid" and fault.fired == 2
    assert [c["idempotency_key"] for c in sim.successful_charges(invoice)] == ["pay-in-1"]
    # Asked again under the same key, Stripe replays the first answer: still one charge.
    assert adapter.pay_invoice(invoice, idempotency_key="pay-in-1").invoice.status == "paid"
    assert sim.total_charged(invoice) == 2500 and len(sim.successful_charges(invoice)) == 1


def test_a_write_that_stays_rate_limited_is_indeterminate_and_charged_once_later(sim):
    invoice = open_renewal(sim)
    sim.faults.rate_limit(PAY, count=1000)
    adapter = provider(sim, budget=0.5)
    with pytest.raises(ProviderIndeterminate, match="rate-limited"):
        adapter.pay_invoice(invoice, idempotency_key="pay-in-2")
    assert sim.total_charged(invoice) == 0  # a 429 applied nothing
    sim.faults.clear()
    assert adapter.pay_invoice(invoice, idempotency_key="pay-in-2").invoice.status == "paid"
    assert sim.total_charged(invoice) == 2500 and len(sim.charges_for_key("pay-in-2")) == 1


def test_writes_through_the_write_bucket_each_charge_once(sim):
    invoices = [open_renewal(sim) for _ in range(4)]
    sim.network.configure(NetworkProfile(write_rate=4, burst=1))
    adapter = provider(sim)
    for n, invoice in enumerate(invoices):
        assert adapter.pay_invoice(invoice, idempotency_key=f"pay-bucket-{n}").invoice.status == "paid"
    assert sim.network.stats()["rate_limited_write"] >= 1
    assert [sim.total_charged(i) for i in invoices] == [2500] * 4
    assert [len(sim.charges_for_key(f"pay-bucket-{n}")) for n in range(4)] == [1] * 4


def test_a_cancel_under_429_cancels_once(sim):
    cus = sim.create_customer("ada@example.com")
    sub = sim.create_subscription(cus, "price_monthly_pro", amount=2000)
    fault = sim.faults.rate_limit("DELETE /v1/subscriptions/*", count=2)
    cancelled = provider(sim).cancel_subscription(sub, idempotency_key="cancel-1")
    assert cancelled.status == "canceled" and fault.fired == 2
    assert len(sim.events_of_type("customer.subscription.deleted")) == 1


def test_threads_sharing_a_paced_adapter_stay_under_the_providers_limit(sim):
    cus = sim.create_customer("ada@example.com", card="ok")
    invoice = sim.get(sim.create_subscription(cus, "price_monthly_pro", amount=2500))["latest_invoice"]
    sim.network.configure(NetworkProfile(read_rate=4, write_rate=4, burst=6))  # slack for a late thread
    adapter = provider(sim, budget=0, max_requests_per_second=3)
    assert adapter.pacer.burst == 3

    fetched = run_together([lambda: [adapter.fetch_invoice(invoice).id for _ in range(3)]] * 4, timeout=60)

    assert fetched == [[invoice] * 3] * 4
    stats = sim.network.stats()
    assert (stats["read"], stats["rate_limited_read"]) == (12, 0)
