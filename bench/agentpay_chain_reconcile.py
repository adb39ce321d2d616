"""Figure 3 of the `agentpay_chain` bench phase (bench/agentpay_chain_bench.py): 1,000 unknown
settlements after an outage, reconciled by the job; every broadcast the node saw is compared with
the persisted raw_tx."""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from collections import Counter
from typing import Any

from bench.agentpay_chain_world import authorized_intent, buyers_of
from bench.common import CHILDREN, PYTHON, Ticker, child_env, db_url, say

PHASE = "agentpay_chain"
LIVE = ("submitted", "pending", "unknown")


# ---- (3) reconcile 1,000 unknowns after an outage ----------------------------------------------------

def _wait(what: str, done: Any, timeout: float = 120.0) -> None:
    began = time.monotonic()
    while not done():
        if time.monotonic() - began > timeout:
            raise RuntimeError(f"{what}: not done after {timeout:.0f} s")
        time.sleep(0.2)


def _submit_all(intent_ids: list[str], label: str, tick: Ticker) -> list[str]:
    """settlement_submit for each; every broadcast's answer is lost, so each must come back unknown."""
    from agentpay.chain.settlement import settlement_submit
    from agentpay.services.results import Cause

    cause = Cause.system("bench-outage")
    for k, intent_id in enumerate(intent_ids):
        outcome = settlement_submit(intent_id, cause=cause)
        if outcome.lines.settlement != "unknown":
            raise RuntimeError(f"{label}: settlement {outcome.lines.settlement}, expected unknown ({outcome.detail})")
        tick(f"{label}: {k + 1}/{len(intent_ids)} signed, persisted, broadcast, recorded unknown")
    return intent_ids


def reconcile(args: argparse.Namespace, chain: Any, seeded: dict[str, Any], database: str) -> dict[str, Any]:
    from django.db import connections
    from django.db.models import Count
    from eth_utils import keccak

    from agentpay.models import ChainNetwork, ChainTransaction, Settlement
    from tests.support.rpc_proxy import RpcProxy

    n = args.chain_reconcile
    network = seeded["network"]
    proxy = RpcProxy(chain.rpc_url, keep=("eth_sendRawTransaction",)).start()
    try:
        # From here on the product reaches the node only through the proxy (the network's rpc_url).
        ChainNetwork.objects.filter(pk=network.pk).update(rpc_url=proxy.url)
        buyers, tick = buyers_of(chain), Ticker(PHASE)
        say(PHASE, f"reconcile: authorizing {n} intents (opened, challenged, PAYMENT-SIGNATURE verified)")
        began = time.monotonic()
        ids = []
        for k in range(n):
            ids.append(authorized_intent(seeded["route"], seeded["tenant"], buyers[k % len(buyers)]))
            tick(f"reconcile: {k + 1}/{n} intents authorized")
        n_mined, n_dropped = n * 4 // 10, n * 3 // 10
        groups = {"mined": ids[:n_mined], "dropped": ids[n_mined:n_mined + n_dropped],
                  "never_sent": ids[n_mined + n_dropped:]}
        submitter = chain.submitter.checksum
        # Mined: the node takes the bytes, the answer is lost. Their nonces come first (a gap below
        # them would keep them out of a block), so they are all mined before the rest is signed.
        proxy.drop("eth_sendRawTransaction", after_forward=True, times=len(groups["mined"]))
        _submit_all(groups["mined"], "mined", tick)
        _wait("the mined group's blocks", lambda: chain.rpc("eth_getTransactionCount", [submitter, "latest"])
              == chain.rpc("eth_getTransactionCount", [submitter, "pending"]))
        # Dropped: mining paused, the node takes the bytes (answer lost) and then forgets them.
        chain.rpc("evm_setIntervalMining", [0])
        head = chain.block_number()
        proxy.drop("eth_sendRawTransaction", after_forward=True, times=len(groups["dropped"]))
        _submit_all(groups["dropped"], "dropped", tick)
        hashes = dict(ChainTransaction.objects.filter(settlement__intent__intent_id__in=ids)
                      .values_list("settlement__intent__intent_id", "tx_hash"))
        for intent_id in groups["dropped"]:
            chain.rpc("anvil_dropTransaction", [hashes[intent_id]])
        # Never sent: the broadcast never reaches the node.
        proxy.drop("eth_sendRawTransaction", after_forward=False, times=len(groups["never_sent"]))
        _submit_all(groups["never_sent"], "never sent", tick)
        hashes = dict(ChainTransaction.objects.filter(settlement__intent__intent_id__in=ids)
                      .values_list("settlement__intent__intent_id", "tx_hash"))
        left_in_pool = sum(chain.rpc("eth_getTransactionByHash", [hashes[i]]) is not None
                           for i in groups["dropped"] + groups["never_sent"])
        if chain.block_number() != head or left_in_pool:
            raise RuntimeError(f"the outage was not staged: {chain.block_number() - head} blocks mined while paused, "
                               f"{left_in_pool} dropped/never-sent transactions known to the node")
        unknown = Settlement.objects.filter(intent__intent_id__in=ids, state="unknown").count()
        if unknown != n:
            raise RuntimeError(f"{unknown} of {n} settlements are unknown after the outage")
        setup_seconds = time.monotonic() - began
        sends_before = len(proxy.payloads)
        chain.rpc("evm_setIntervalMining", [1])  # the node is back, 1-second blocks
        say(PHASE, f"reconcile: {n} settlements unknown ({', '.join(f'{len(v)} {k}' for k, v in groups.items())}) "
                   f"after {setup_seconds:.0f} s of set-up; running agentpay_onchain_reconcile until none is "
                   f"submitted/pending/unknown")
        connections.close_all()
        worker = CHILDREN.start("chain-reconcile", [PYTHON, "-m", "bench.chain_reconcile_worker", "--timeout",
                                                    "300"], env=child_env(DATABASE_URL=db_url(database)),
                                stdout=subprocess.PIPE)
        trace: list[dict[str, Any]] = []
        done: dict[str, Any] = {}
        progress = Ticker(PHASE)
        try:
            assert worker.stdout is not None
            for raw in worker.stdout:
                line = raw.decode(errors="replace").strip()
                if line.startswith("PROGRESS "):
                    trace.append(json.loads(line[9:]))
                    t = trace[-1]
                    shown = {k: v for k, v in t["states"].items() if k != "not_started"}  # figure 1's challenges
                    progress(f"reconcile run {t['run']} at {t['seconds']:.1f} s: {t['live']} still open, states "
                             f"{shown} ({t['examined']} examined, {t['changed']} changed, {t['errors']} errors)",
                             force=bool(t["changed"] or t["errors"]))
                elif line.startswith("RESULT "):
                    done = json.loads(line[7:])
            worker.wait(30)
        finally:
            CHILDREN.stop(worker)
        if not done:
            raise RuntimeError(f"bench.chain_reconcile_worker gave no result (exit {worker.returncode}); see stderr")
        persisted = dict(ChainTransaction.objects.filter(settlement__intent__intent_id__in=ids)
                         .values_list("tx_hash", "raw_tx"))
        group_of = {hashes[i]: g for g, members in groups.items() for i in members}
        sends = [str(params[0]).lower() for _, params in proxy.payloads]
    finally:
        proxy.stop()
    different = 0
    resent: Counter = Counter()
    for k, raw in enumerate(sends):
        tx_hash = "0x" + keccak(hexstr=raw).hex()
        if persisted.get(tx_hash) != raw:
            different += 1  # bytes the product never persisted: a re-signed or altered transaction
        elif k >= sends_before:
            resent[group_of[tx_hash]] += 1
    final = dict(Settlement.objects.filter(intent__intent_id__in=ids).order_by().values_list("state")
                 .annotate(c=Count("pk")))
    per_group = {g: dict(Settlement.objects.filter(intent__intent_id__in=members).order_by().values_list("state")
                         .annotate(c=Count("pk"))) for g, members in groups.items()}
    broadcasts = Counter(ChainTransaction.objects.filter(settlement__intent__intent_id__in=ids)
                         .values_list("broadcast_attempts", flat=True))
    result = {"settlements": n, "groups": {g: len(v) for g, v in groups.items()}, "setup_seconds": setup_seconds,
              "seconds": done["seconds"], "runs": done["runs"], "job_errors": done["errors"],
              "job_notes": done["notes"], "timed_out": done["timed_out"], "states": final, "states_by_group": per_group,
              "unresolved": sum(final.get(s, 0) for s in LIVE), "sends_seen_by_node": len(sends),
              "rebroadcasts": sum(resent.values()), "rebroadcasts_by_group": dict(resent),
              "rebroadcast_different_bytes": different, "broadcast_attempts_histogram": dict(broadcasts),
              "trace": [{"seconds": t["seconds"], "live": t["live"], "states": t["states"]} for t in trace]}
    say(PHASE, f"reconcile: {n} unknowns -> {final} in {done['seconds']:.1f} s ({done['runs']} runs); "
               f"{result['rebroadcasts']} rebroadcasts {dict(resent)}, {different} with bytes other than the "
               f"persisted raw_tx (of {len(sends)} sends the node saw)")
    return result
