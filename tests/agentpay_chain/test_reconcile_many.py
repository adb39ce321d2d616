"""After an outage: many settlements whose broadcast answer was lost are unknown; one reconcile
run resolves them all by their receipts, none sent again (issue 18 item 6, at test size; the
bench's 1,000 is AGENTPAY_RECONCILE_N=1000)."""

from __future__ import annotations

import os
import time

import pytest

from agentpay.chain.settlement import settlement_submit
from agentpay.jobs import agentpay_job_run
from agentpay.models import ChainTransaction, Settlement
from agentpay.services.results import Cause
from tests.agentpay_chain.support import authorized_intent, world
from tests.support.rpc_proxy import RpcProxy

pytestmark = pytest.mark.django_db(transaction=True)
N = int(os.environ.get("AGENTPAY_RECONCILE_N", "40"))


def test_unknown_settlements_after_an_outage_resolve_in_one_run_without_rebroadcast(chain, upstream):
    with RpcProxy(chain.rpc_url) as proxy:
        w = world(chain, upstream, rpc_url=proxy.url, rpc_timeout_seconds=2.0, price=1)
        payer = chain.payers[0]
        before = chain.balance(payer.address)
        intents = [authorized_intent(w, payer) for _ in range(N)]
        proxy.drop("eth_sendRawTransaction", after_forward=True, times=N)
        for intent in intents:
            assert settlement_submit(intent.intent_id, cause=Cause.system("outage")).lines.settlement == "unknown"
        assert Settlement.objects.filter(state="unknown").count() == N
        sent = proxy.calls.count("eth_sendRawTransaction")
        started = time.monotonic()
        run = agentpay_job_run("agentpay_onchain_reconcile")
        took = time.monotonic() - started
        assert proxy.calls.count("eth_sendRawTransaction") == sent  # nothing rebroadcast
    print(f"\nreconciled {N} unknown settlements in {took:.2f} s ({run.changed} changed, {run.errors} errors)")
    assert run.errors == 0, run.notes
    assert Settlement.objects.filter(state="confirmed").count() == N
    assert set(ChainTransaction.objects.values_list("broadcast_attempts", flat=True)) == {1}
    assert chain.balance(payer.address) == before - N * w.amount
