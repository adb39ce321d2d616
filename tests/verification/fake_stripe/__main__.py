"""``python -m tests.verification.fake_stripe --port 12111 --webhook-url http://127.0.0.1:8000/webhooks/stripe/
--secret whsec_local [--auto-deliver] [--network test --latency-ms 150 --latency-spread-ms 50 --rate-limit 25]``:
serve the simulator with its ``/_sim/`` control API."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence

from tests.verification.fake_stripe.realism import NetworkProfile
from tests.verification.fake_stripe.rendering import DEFAULT_API_VERSION
from tests.verification.fake_stripe.simulator import StripeSimulator


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tests.verification.fake_stripe", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=12111)
    parser.add_argument("--webhook-url", default=None, help="where signed webhooks are POSTed")
    parser.add_argument("--secret", action="append", default=None,
                        help="webhook signing secret; repeat to sign with several (secret rolling)")
    parser.add_argument("--auto-deliver", action="store_true", help="deliver each event as soon as it is created")
    parser.add_argument("--account", default="acct_demo")
    parser.add_argument("--webhook-api-version", default=DEFAULT_API_VERSION)
    parser.add_argument("--pump-seconds", type=float, default=1.0,
                        help="with --auto-deliver: how often delayed and failed deliveries are retried")
    parser.add_argument("--verbose", action="store_true", help="log every HTTP request")
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
    return parser


def network_profile(args: argparse.Namespace) -> NetworkProfile:
    overrides = {name: value for name, value in (
        ("latency_ms", args.latency_ms), ("latency_spread_ms", args.latency_spread_ms),
        ("read_rate", args.rate_limit), ("write_rate", args.write_rate_limit or args.rate_limit),
        ("burst", args.burst), ("retry_after", args.retry_after), ("seed", args.realism_seed)) if value is not None}
    return NetworkProfile.preset(args.network, **overrides)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def say(message: str) -> None:
        print(f"[stripe-sim] {message}", flush=True)

    sim = StripeSimulator(account=args.account, webhook_secrets=args.secret or ["whsec_local"],
                          webhook_api_version=args.webhook_api_version, sink=args.webhook_url,
                          auto_deliver=args.auto_deliver, logger=say, network=network_profile(args))
    base_url = sim.start(args.host, args.port, verbose=args.verbose)
    say(f"listening on {base_url} (account {args.account}, webhook API version {args.webhook_api_version})")
    say(f"webhooks -> {args.webhook_url or '(none: events stay queued)'}; "
        f"{'auto-deliver' if args.auto_deliver else 'deliver with POST /_sim/deliver_all'}")
    if sim.network.profile.enabled:
        say(f"network realism: {sim.network.profile.as_dict()}")
    say("control API: POST /_sim/customers, /_sim/subscriptions, /_sim/invoices/{id}/attempt, ... GET /_sim/ledger")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(args.pump_seconds):
            if args.auto_deliver:
                sim.deliver_due()
    except KeyboardInterrupt:
        pass
    finally:
        sim.stop()
        say("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
