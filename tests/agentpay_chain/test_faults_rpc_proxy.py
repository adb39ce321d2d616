"""Settlement faults injected by the JSON-RPC proxy in front of anvil (issue 18 item 5): the
broadcast lost after the node accepted it, the receipt query timing out, and an authorization
carried by another transaction while our broadcast never arrived. Each ends with the intent
where the seed's tables put it, the payer debited exactly once, no upstream call before the
settlement confirmed, and never a second signature."""

from __future__ import annotations

import pytest

from agentpay.chain.settlement import settlement_query, settlement_submit
from agentpay.chain.transactions import authorization_calldata
from agentpay.jobs import agentpay_job_run
from agentpay.models import ChainTransaction, RefundObligation
from agentpay.services.recovery import review_resolve
from tests.agentpay_chain.support import authorized_intent, lines, settlement_events, world
from tests.agentpay_chain.test_faults import CAUSE, drive, tx_of
from tests.support.rpc_proxy import RpcProxy

pytestmark = pytest.mark.django_db(transaction=True)

def test_broadcast_lost_after_the_node_accepted_it(chain, upstream):
    """The node took the transaction but we never heard: unknown, then the receipt by hash
    confirms it. One transfer on chain; never a second signature."""
    with RpcProxy(chain.rpc_url) as proxy:
        w = world(chain, upstream, rpc_url=proxy.url, rpc_timeout_seconds=1.0)
        payer = chain.payers[0]
        before = chain.balance(payer.address)
        intent = authorized_intent(w, payer)
        proxy.drop("eth_sendRawTransaction", after_forward=True, times=1)
        first = settlement_submit(intent.intent_id, cause=CAUSE)
        assert first.accepted and first.lines.settlement == "unknown"
        assert upstream.calls == []
        driven = drive(intent)
        assert driven.answer is not None and driven.answer.status == 200
    assert lines(intent) == ("completed", "confirmed", "succeeded")
    assert settlement_events(intent) == ["submit_timeout", "query_found_confirmed"]
    assert chain.balance(payer.address) == before - w.amount
    assert ChainTransaction.objects.filter(settlement__intent=intent).count() == 1
    assert tx_of(intent).broadcast_attempts == 1  # found by its hash, not sent again
    assert proxy.calls.count("eth_sendRawTransaction") == 1


def test_receipt_query_timing_out_is_unknown_then_confirmed(chain, upstream):
    with RpcProxy(chain.rpc_url) as proxy:
        w = world(chain, upstream, rpc_url=proxy.url, rpc_timeout_seconds=0.5)
        payer = chain.payers[0]
        before = chain.balance(payer.address)
        intent = authorized_intent(w, payer)
        assert settlement_submit(intent.intent_id, cause=CAUSE).lines.settlement == "submitted"
        proxy.delay("eth_getTransactionReceipt", 2.0)
        timed_out = settlement_query(intent.intent_id, cause=CAUSE)
        assert timed_out.lines.settlement == "unknown"
        assert upstream.calls == []
        proxy.clear()
        assert drive(intent).answer.status == 200
    assert settlement_events(intent) == ["submit_ok", "query_timeout", "query_found_confirmed"]
    assert lines(intent) == ("completed", "confirmed", "succeeded")
    assert chain.balance(payer.address) == before - w.amount
    assert len(upstream.calls) == 1


def test_the_authorization_carried_by_another_transaction_after_our_timeout_is_our_payment(chain, upstream):
    """Our broadcast never reached the node; someone else submitted the payer's authorization.
    Our own bytes would now revert 'authorization is used': that is evidence of payment, not a
    rejection. authorizationState + AuthorizationUsed + its Transfer to pay_to confirm it."""
    with RpcProxy(chain.rpc_url) as proxy:
        w = world(chain, upstream, rpc_url=proxy.url, rpc_timeout_seconds=1.0)
        payer = chain.payers[0]
        before = chain.balance(payer.address)
        intent = authorized_intent(w, payer)
        proxy.drop("eth_sendRawTransaction", after_forward=False, times=1)
        assert settlement_submit(intent.intent_id, cause=CAUSE).lines.settlement == "unknown"
        other = chain.send(chain.deployer, to=w.network.token_address,
                           data=authorization_calldata(intent.authorization))
        assert int(chain.wait_receipt(other)["status"], 16) == 1
        assert drive(intent).answer.status == 200
    assert settlement_events(intent) == ["submit_timeout", "query_found_confirmed"]
    assert chain.balance(payer.address) == before - w.amount
    assert len(upstream.calls) == 1


def test_confirmed_only_after_review_is_never_dispatched_and_leaves_a_refund(chain, upstream, lead, settings):
    """C09/O29: the settlement stays unknown past the recovery deadline (queries time out), the
    intent goes to needs_review; the chain then shows it confirmed. Nothing is dispatched; the
    owner closes it as not delivered, which records the refund owed."""
    settings.AGENTPAY_RECOVERY_DEADLINE_SECONDS = 0
    with RpcProxy(chain.rpc_url) as proxy:
        w = world(chain, upstream, rpc_url=proxy.url, rpc_timeout_seconds=0.5)
        intent = authorized_intent(w, chain.payers[0])
        proxy.drop("eth_sendRawTransaction", after_forward=True, times=1)
        assert settlement_submit(intent.intent_id, cause=CAUSE).lines.settlement == "unknown"
        proxy.delay("eth_blockNumber", 2.0)
        run = agentpay_job_run("agentpay_onchain_reconcile")
        assert run.errors == 0, run.notes
        assert lines(intent) == ("needs_review", "unknown", "not_started")
        proxy.clear()
        agentpay_job_run("agentpay_onchain_reconcile", now=tx_of(intent).next_query_at)
        assert lines(intent) == ("needs_review", "confirmed", "not_started")
        assert drive(intent).answer is None
    assert upstream.calls == []
    closed = review_resolve(intent_id=intent.intent_id, delivered=False, user=lead, reason="paid after the answer",
                            ticket="OPS-205")
    assert closed.accepted, closed
    assert lines(intent) == ("failed", "confirmed", "not_started")
    assert RefundObligation.objects.get(intent=intent).state == "not_started"
