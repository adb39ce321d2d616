"""The Stripe simulator as a bench subprocess, seeded in bulk in-process.

``python -m bench.simproc --count N --out FILE [--paid] [--network live --latency-ms 150 ...]``

One prototype customer / subscription / renewal invoice is made through the simulator's own
operations (the renewal's automatic attempt is hard-declined, so the invoice is open with one
attempt and no retry scheduled). It is then cloned N times by rewriting its ids in its JSON form and
putting the copies straight into the store: no events, no version history, so 100k invoices
seed in seconds. With ``--paid`` every clone's invoice is then paid by the customer through the
simulator (``customer_pays``), and the ``invoice.paid`` events it emits are written out for the
bench to deliver. Writes FILE (JSON), then prints ``READY <base url>`` and serves until SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import threading
import time
from typing import Any

from bench.common import HARD_DECLINE as DECLINE
from tests.verification.fake_stripe import StripeSimulator
from tests.verification.fake_stripe.realism_cli import add_realism_arguments, network_profile


def seed(sim: StripeSimulator, count: int, *, price: str, amount: int) -> list[dict[str, Any]]:
    cus = sim.create_customer("prototype@bench.invalid", "ok")
    sub = sim.create_subscription(cus, price, amount=amount)
    sim.set_card(cus, DECLINE)
    inv_id = sim.create_renewal_invoice(sub)
    sim.provider_attempt(inv_id)
    rows: list[dict[str, Any]] = []
    with sim.lock:
        store = sim.store
        inv = store.objects[inv_id]
        customer, subscription = store.objects[cus], store.objects[sub]
        pi, charge = store.objects[inv["payment_intent"]], store.objects[inv["charge"]]
        kinds = {
            customer["id"]: "customer", customer["payment_method"]: "payment_method",
            subscription["id"]: "subscription",
            subscription["item_id"]: "subscription_item", inv["id"]: "invoice", inv["line_id"]: "line_item",
            pi["id"]: "payment_intent", charge["id"]: "charge", inv["payments"][0]["id"]: "invoice_payment",
        }
        template = json.dumps([customer, subscription, inv, pi, charge])
        pattern = re.compile("|".join(re.escape(old) for old in kinds))
        for i in range(count):
            new = {old: store.new_id(kind) for old, kind in kinds.items()}
            objs = json.loads(pattern.sub(lambda m, new=new: new[m.group(0)], template))
            objs[0]["email"] = f"bench{i}@bench.invalid"
            for obj in objs:
                store.objects[obj["id"]] = obj
            c, s, v = objs[0], objs[1], objs[2]
            store.invoice_payment_index[v["payments"][0]["id"]] = v["id"]
            rows.append({"customer": c["id"], "subscription": s["id"], "invoice": v["id"],
                         "amount": v["amount_due"], "currency": v["currency"], "attempt_count": v["attempt_count"],
                         "payment_ref": new[pi["id"]], "decline_code": DECLINE})
        store.events.clear()
        store.events_by_id.clear()
        sim.outbox.clear()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.simproc")
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--paid", action="store_true")
    parser.add_argument("--price", default="price_monthly_pro")
    parser.add_argument("--amount", type=int, default=2000)
    parser.add_argument("--account", default="acct_demo")
    add_realism_arguments(parser)
    args = parser.parse_args(argv)

    sim = StripeSimulator(account=args.account, webhook_secrets=["whsec_bench"], sink=None, auto_deliver=False)
    started = time.monotonic()
    rows = seed(sim, args.count, price=args.price, amount=args.amount)
    seeded = time.monotonic() - started
    events: dict[str, str] = {}
    if args.paid:
        for row in rows:
            sim.customer_pays(row["invoice"])
        with sim.lock:
            for event in sim.store.events:
                if event["type"] == "invoice.paid":
                    events[event["data"]["object"]["id"]] = json.dumps(event)
            sim.store.events.clear()
            sim.store.events_by_id.clear()
            sim.outbox.clear()
        for row in rows:
            row["event"] = events[row["invoice"]]
    with open(args.out, "w") as fh:
        json.dump({"rows": rows, "seed_seconds": round(seeded, 3), "paid_seconds":
                   round(time.monotonic() - started - seeded, 3)}, fh)
    # Seeding is in process; only the served API (what the product calls) gets the latency and the limit.
    sim.network.configure(network_profile(args))
    base_url = sim.start("127.0.0.1", 0)
    print(f"READY {base_url}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    sim.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
