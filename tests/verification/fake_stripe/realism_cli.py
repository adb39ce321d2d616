"""The simulator's network-realism flags, shared by its own command line and the bench's simulator
process (bench.simproc), so both take the same options and mean the same by them."""

from __future__ import annotations

import argparse

from tests.verification.fake_stripe.realism import NetworkProfile


def add_realism_arguments(parser: argparse.ArgumentParser) -> None:
    realism = parser.add_argument_group("network realism (off by default; see realism.py)")
    realism.add_argument("--network", choices=("off", "live", "test"), default="off",
                         help="preset: live = 100 req/s, test = 25 req/s (reads and writes each), both 150 ± 50 ms")
    realism.add_argument("--latency-ms", type=float, default=None, help="mean latency of each API call")
    realism.add_argument("--latency-spread-ms", type=float, default=None, help="its standard deviation (clipped ±2σ)")
    realism.add_argument("--rate-limit", type=float, default=None,
                         help="requests a second before HTTP 429, reads and writes each")
    realism.add_argument("--write-rate-limit", type=float, default=None, help="writes a second (default: --rate-limit)")
    realism.add_argument("--burst", type=float, default=None, help="token bucket size (default: one second's worth)")
    realism.add_argument("--retry-after", type=float, default=None,
                         help="send Retry-After: N with each 429 (real Stripe sends none)")
    realism.add_argument("--realism-seed", type=int, default=None, help="seed of the latency draws")


def network_profile(args: argparse.Namespace) -> NetworkProfile:
    overrides = {name: value for name, value in (
        ("latency_ms", args.latency_ms), ("latency_spread_ms", args.latency_spread_ms),
        ("read_rate", args.rate_limit), ("write_rate", args.write_rate_limit or args.rate_limit),
        ("burst", args.burst), ("retry_after", args.retry_after), ("seed", args.realism_seed)) if value is not None}
    return NetworkProfile.preset(args.network, **overrides)
