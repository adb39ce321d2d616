"""``python -m tests.verification.fake_alipay --port 12112 --app-id 2021000000000001
--app-public-key app_public.pem --notify-url http://127.0.0.1:8000/webhooks/alipay/``

Serves the simulator with its ``/_control/`` API and delivers notifications from a background pump.
Without ``--app-public-key`` it generates both key pairs and writes them to ``--key-dir`` (the app's
private key is what the product signs with; Alipay's public key is what it verifies with)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from Cryptodome.PublicKey import RSA

from tests.verification.fake_alipay.keys import generate_key_pair
from tests.verification.fake_alipay.server import AlipaySimulator


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tests.verification.fake_alipay", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=12112)
    parser.add_argument("--app-id", default="2021000000000001")
    parser.add_argument("--app-public-key", type=Path, help="PEM file of the app's public key")
    parser.add_argument("--alipay-private-key", type=Path, help="PEM file of Alipay's private key")
    parser.add_argument("--key-dir", type=Path, default=Path(".cache/fake_alipay"),
                        help="where generated keys are written")
    parser.add_argument("--notify-url", default="", help="the app's default notification URL")
    parser.add_argument("--pump-seconds", type=float, default=0.5, help="how often due notifications are sent")
    parser.add_argument("--verbose", action="store_true", help="log every HTTP request")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def say(message: str) -> None:
        print(f"[alipay-sim] {message}", flush=True)

    args.key_dir.mkdir(parents=True, exist_ok=True)
    if args.alipay_private_key:
        alipay_private = args.alipay_private_key.read_text()
        alipay_public = RSA.import_key(alipay_private).publickey().export_key().decode()
    else:
        alipay_private, alipay_public = generate_key_pair()
        (args.key_dir / "alipay_private.pem").write_text(alipay_private)
    (args.key_dir / "alipay_public.pem").write_text(alipay_public)
    if args.app_public_key:
        app_public = args.app_public_key.read_text()
    else:
        app_private, app_public = generate_key_pair()
        (args.key_dir / "app_private.pem").write_text(app_private)
        (args.key_dir / "app_public.pem").write_text(app_public)
    sim = AlipaySimulator(alipay_private_pem=alipay_private, alipay_public_pem=alipay_public, logger=say)
    sim.register_app(args.app_id, app_public, args.notify_url)
    base_url = sim.start(args.host, args.port, verbose=args.verbose)
    sim.start_pump(args.pump_seconds)
    say(f"gateway {base_url}/gateway.do (app {args.app_id}); keys in {args.key_dir}")
    say(f"notifications -> {args.notify_url or '(per trade.pay notify_url only)'}")
    say("control API: POST /_control/users, /_control/agreements, /_control/clock/advance, /_control/faults, "
        "GET /_control/trades, /_control/deliveries")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        sim.stop()
        say("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
