"""The simulator's network realism (issue 21 item 1): per-call latency that overlaps across
concurrent requests, and Stripe's request-rate limit answering 429 the way Stripe does. Real
HTTP on loopback. Timing bounds are generous: the machine may be loaded."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.verification.fake_stripe import StripeSimulator
from tests.verification.fake_stripe.__main__ import build_parser, network_profile
from tests.verification.fake_stripe.realism import NetworkConditions, NetworkProfile

ROOT = Path(__file__).resolve().parents[2]
AUTH = {"Authorization": "Bearer sk_test_local"}


def request(base: str, method: str, path: str, body: dict[str, Any] | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], dict[str, Any]]:
    data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
    req = urllib.request.Request(base + path, data=data, method=method, headers={**AUTH, **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read())


@pytest.fixture
def sim() -> Iterator[StripeSimulator]:
    simulator = StripeSimulator()
    simulator.start()
    yield simulator
    simulator.stop()


def an_invoice(sim: StripeSimulator) -> str:
    cus = sim.create_customer("ada@example.com")
    sub = sim.create_subscription(cus, "price_monthly_pro", amount=2000)
    return sim.get(sub)["latest_invoice"]


def test_off_by_default(sim):
    assert not sim.network.profile.enabled
    invoice = an_invoice(sim)
    started = time.monotonic()
    for _ in range(30):
        assert request(sim.base_url, "GET", f"/v1/invoices/{invoice}")[0] == 200
    assert time.monotonic() - started < 3.0
    assert sim.network.stats()["rate_limited_read"] == 0


def test_latency_is_applied_and_concurrent_calls_overlap(sim):
    invoice = an_invoice(sim)
    sim.network.configure(NetworkProfile(latency_ms=300))
    started = time.monotonic()
    assert request(sim.base_url, "GET", f"/v1/invoices/{invoice}")[0] == 200
    one = time.monotonic() - started
    assert one >= 0.29

    results: list[tuple[int, float]] = []
    lock = threading.Lock()

    def call() -> None:
        t0 = time.monotonic()
        status = request(sim.base_url, "GET", f"/v1/invoices/{invoice}")[0]
        with lock:
            results.append((status, time.monotonic() - t0))

    threads = [threading.Thread(target=call) for _ in range(8)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    wall = time.monotonic() - started
    assert [status for status, _ in results] == [200] * 8
    assert all(took >= 0.29 for _, took in results)
    assert wall < 5 * 0.3, f"8 concurrent calls took {wall:.2f} s: latency must not serialise them"


def test_a_write_holds_no_lock_while_it_travels(sim):
    """A slow write does not hold up a read: latency is spent outside the simulator's lock."""
    cus = sim.create_customer("ada@example.com")
    sim.network.configure(NetworkProfile(latency_ms=600))
    done: dict[str, float] = {}

    def write() -> None:
        request(sim.base_url, "POST", f"/_sim/customers/{cus}/card", {"card": "ok"})  # control: no latency
        request(sim.base_url, "POST", f"/v1/subscriptions/{sim.create_subscription(cus, 'price_monthly_pro')}",
                headers={"Content-Type": "application/x-www-form-urlencoded"})
        done["write"] = time.monotonic()

    thread = threading.Thread(target=write)
    thread.start()
    time.sleep(0.05)
    assert sim.lock.acquire(timeout=0.2), "the simulator's lock is held while a request travels"
    sim.lock.release()
    thread.join(timeout=10)
    assert "write" in done


def test_latency_draws_are_seeded_and_clipped():
    profile = NetworkProfile(latency_ms=150, latency_spread_ms=50, seed=7)
    first = NetworkConditions(profile)
    draws = [first.draw_latency() for _ in range(500)]
    second = NetworkConditions(profile)
    assert [second.draw_latency() for _ in range(500)] == draws
    assert all(0.05 - 1e-9 <= d <= 0.25 + 1e-9 for d in draws)
    assert 0.13 < sum(draws) / len(draws) < 0.17
    assert len(set(draws)) > 400
    assert NetworkConditions(NetworkProfile(latency_ms=20, latency_spread_ms=50)).draw_latency() >= 0


def test_the_limiter_answers_429_as_stripe_does_and_recovers(sim):
    invoice = an_invoice(sim)
    sim.network.configure(NetworkProfile(read_rate=10, burst=5))
    answers = [request(sim.base_url, "GET", f"/v1/invoices/{invoice}") for _ in range(15)]
    statuses = [status for status, _, _ in answers]
    assert statuses[:5] == [200] * 5
    assert statuses.count(429) >= 5, statuses
    status, headers, body = next(a for a in answers if a[0] == 429)
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["code"] == "rate_limit"
    assert body["error"]["message"].startswith("Request rate limit exceeded.")
    assert body["error"]["doc_url"].endswith("/rate-limit")
    assert headers["Stripe-Rate-Limited-Reason"] == "global-rate"
    assert "Retry-After" not in headers and "Stripe-Should-Retry" not in headers
    assert headers.get("Request-Id", "").startswith("req_")

    time.sleep(0.35)  # 10/s refills at least 3 tokens
    assert request(sim.base_url, "GET", f"/v1/invoices/{invoice}")[0] == 200
    stats = sim.network.stats()
    assert stats["rate_limited_read"] == statuses.count(429) and stats["read"] == 16


def test_reads_and_writes_have_their_own_buckets_and_control_is_not_limited(sim):
    invoice = an_invoice(sim)
    sim.network.configure(NetworkProfile(read_rate=1, write_rate=50, burst=1, retry_after=2))
    assert request(sim.base_url, "GET", f"/v1/invoices/{invoice}")[0] == 200
    status, headers, _ = request(sim.base_url, "GET", f"/v1/invoices/{invoice}")
    assert status == 429 and headers["Retry-After"] == "2"
    # A write still passes (its own bucket, one token), the control API is never limited.
    status, _, _ = request(sim.base_url, "POST", f"/v1/invoices/{invoice}/finalize")
    assert status != 429
    for _ in range(5):
        assert request(sim.base_url, "GET", f"/_sim/invoices/{invoice}")[0] == 200


def test_a_rate_limit_fault_answers_429_and_applies_nothing(sim):
    cus = sim.create_customer("ada@example.com", card="ok")
    sub = sim.create_subscription(cus, "price_monthly_pro", amount=2000)
    invoice = sim.create_renewal_invoice(sub)
    fault = sim.faults.rate_limit("POST /v1/invoices/*/pay", count=2, retry_after=0.5)
    key = {"Idempotency-Key": "pay-once"}
    for _ in range(2):
        status, headers, body = request(sim.base_url, "POST", f"/v1/invoices/{invoice}/pay", headers=key)
        assert (status, body["error"]["code"], headers["Retry-After"]) == (429, "rate_limit", "0.5")
    assert sim.total_charged(invoice) == 0
    status, _, body = request(sim.base_url, "POST", f"/v1/invoices/{invoice}/pay", headers=key)
    assert status == 200 and body["status"] == "paid" and fault.fired == 2
    assert sim.total_charged(invoice) == 2000 and len(sim.charges_for_key("pay-once")) == 1


def test_the_control_api_switches_realism_on_and_off(sim):
    status, _, stats = request(sim.base_url, "POST", "/_sim/realism", {"preset": "test", "latency_ms": 5, "seed": 3})
    assert status == 200
    assert stats["profile"] == {"latency_ms": 5.0, "latency_spread_ms": 50.0, "read_rate": 25.0, "write_rate": 25.0,
                                "burst": None, "retry_after": None, "seed": 3}
    assert sim.network.profile == NetworkProfile.stripe_test(latency_ms=5, seed=3)
    assert request(sim.base_url, "POST", "/_sim/realism", {"latency": 5})[0] == 400
    status, _, stats = request(sim.base_url, "POST", "/_sim/realism", {})
    assert status == 200 and stats["enabled"] is False
    status, _, _ = request(sim.base_url, "POST", "/_sim/faults", {"kind": "rate_limit", "pattern": "GET /v1/**"})
    assert status == 200
    assert request(sim.base_url, "GET", "/v1/invoices/in_nope")[0] == 429
    assert request(sim.base_url, "GET", "/v1/invoices/in_nope")[0] == 404


def test_command_line_flags():
    assert network_profile(build_parser().parse_args([])) == NetworkProfile()
    args = build_parser().parse_args(["--latency-ms", "150", "--latency-spread-ms", "50", "--rate-limit", "100"])
    assert network_profile(args) == NetworkProfile(150, 50, 100, 100)
    args = build_parser().parse_args(["--network", "live", "--write-rate-limit", "40", "--realism-seed", "9"])
    assert network_profile(args) == NetworkProfile.stripe_live(write_rate=40, seed=9)


def test_the_server_process_takes_the_flags():
    proc = subprocess.Popen([sys.executable, "-m", "tests.verification.fake_stripe", "--port", "0", "--network", "test",
                             "--rate-limit", "2"], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        lines = [proc.stdout.readline() for _ in range(3)]
        base = lines[0].split("listening on ")[1].split()[0]
        realism = next(line for line in lines if "network realism" in line)
        assert "'read_rate': 2.0" in realism
        status, _, stats = request(base, "GET", "/_sim/realism")
        assert status == 200 and stats["profile"]["latency_ms"] == 150.0
    finally:
        proc.terminate()
        proc.wait(timeout=10)
