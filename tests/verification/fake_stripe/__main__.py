"""``python -m tests.verification.fake_stripe --port 12111 --webhook-url http://127.0.0.1:8000/webhooks/stripe/
--secret whsec_local [--auto-deliver] [--network test --latency-ms 150 --latency-spread-ms 50 --rate-limit 25]``:
serve the simulator with its ``/_sim/`` control API."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence

from tests.verification.fake_stripe.realism_cli import add_realism_arguments, network_profile
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
    add_realism_arguments(parser)
    return parser


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
