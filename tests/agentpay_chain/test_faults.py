"""Settlement on the real local chain, with faults injected (issue 18 item 5).

Each test ends with the intent where the seed's tables put it, the payer's token balance
debited exactly once (or not at all), and no upstream call before the settlement confirmed
(the loopback upstream records every call). The JSON-RPC proxy in front of anvil loses or
delays answers; anvil's own methods pause mining, drop a transaction and reorganise.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from agentpay.bridge import trusted_now
from agentpay.chain import settlement as settlement_module
from agentpay.chain.settlement import settlement_audit_confirmed, settlement_query, settlement_submit
from agentpay.jobs import agentpay_job_run
from agentpay.models import ChainTransaction
from agentpay.services.onchain_flow import intent_drive_onchain
from agentpay.services.results import Cause
from tests.agentpay_chain.support import authorized_intent, lines, settlement_events, world

pytestmark = pytest.mark.django_db(transaction=True)
CAUSE = Cause.system("test")
ACCESS = None


def drive(intent, wait: float = 5.0):
    return intent_drive_onchain(intent=intent, cause=CAUSE, access=ACCESS, request_id=intent.first_request_id,
                                wait_seconds=wait)


def tx_of(intent) -> ChainTransaction:
    return ChainTransaction.objects.get(settlement__intent=intent)


def reconcile():
    return agentpay_job_run("agentpay_onchain_reconcile")


def test_happy_path_settles_then_fulfils_once(chain, upstream):
    w = world(chain, upstream)
    payer = chain.payers[0]
    before, pay_to_before = chain.balance(payer.address), chain.balance(w.network.pay_to)
    intent = authorized_intent(w, payer)
    driven = drive(intent)
    assert driven.answer is not None and driven.answer.status == 200
    assert lines(intent) == ("completed", "confirmed", "succeeded")
    assert settlement_events(intent) == ["submit_ok", "seen_on_chain", "confirmations_reached"]
    assert chain.balance(payer.address) == before - w.amount
    assert chain.balance(w.network.pay_to) == pay_to_before + w.amount
    assert len(upstream.calls) == 1
    tx = tx_of(intent)
    assert tx.broadcast_attempts == 1 and tx.next_query_at is None and tx.receipt_status == 1


def test_mining_paused_stays_pending_then_confirms(chain, upstream):
    w = world(chain, upstream)
    payer = chain.payers[0]
    before = chain.balance(payer.address)
    intent = authorized_intent(w, payer)
    chain.set_automine(False)
    try:
        driven = drive(intent, wait=0.6)
        assert driven.answer is None and driven.refusal == ""
        assert lines(intent) == ("authorized", "pending", "not_started")
        assert upstream.calls == [] and chain.balance(payer.address) == before
        chain.mine()
    finally:
        chain.set_automine(True)
    assert drive(intent).answer.status == 200
    assert settlement_events(intent) == ["submit_ok", "seen_on_chain", "confirmations_reached"]
    assert chain.balance(payer.address) == before - w.amount
    assert len(upstream.calls) == 1


def test_a_dropped_transaction_is_sent_again_byte_for_byte(chain, upstream):
    w = world(chain, upstream)
    payer = chain.payers[0]
    before = chain.balance(payer.address)
    intent = authorized_intent(w, payer)
    chain.set_automine(False)
    try:
        assert settlement_submit(intent.intent_id, cause=CAUSE).lines.settlement == "submitted"
        tx = tx_of(intent)
        chain.drop_transaction(tx.tx_hash)
        assert chain.w3.eth.get_transaction_count(chain.w3.to_checksum_address(tx.sender), "pending") == \
            tx.sender_nonce  # really gone from the node
        settlement_query(intent.intent_id, cause=CAUSE)  # dropped → the same bytes again
        again = tx_of(intent)
        assert again.broadcast_attempts == 2 and again.raw_tx == tx.raw_tx and again.tx_hash == tx.tx_hash
        assert chain.w3.eth.get_transaction(tx.tx_hash) is not None
        chain.mine()
    finally:
        chain.set_automine(True)
    assert drive(intent).answer.status == 200
    assert lines(intent) == ("completed", "confirmed", "succeeded")
    assert chain.balance(payer.address) == before - w.amount
    assert ChainTransaction.objects.count() == 1


def test_dropped_past_valid_before_is_failed_and_charges_nothing(chain, upstream):
    w = world(chain, upstream)
    payer = chain.payers[0]
    before = chain.balance(payer.address)
    # The last block may be older than the trusted clock the gateway checks the window against.
    now_on_chain = max(chain.latest_timestamp(), int(trusted_now().timestamp()))
    valid_before = now_on_chain + 120
    intent = authorized_intent(w, payer, valid_before=valid_before)
    chain.set_automine(False)
    try:
        settlement_submit(intent.intent_id, cause=CAUSE)
        chain.drop_transaction(tx_of(intent).tx_hash)
        chain.set_next_block_timestamp(valid_before + 60)
        chain.mine()  # an empty block: chain time is now past validBefore, however old the last one was
        driven = drive(intent)
    finally:
        chain.set_automine(True)
    assert driven.refusal == "SETTLEMENT_FAILED"
    assert lines(intent) == ("failed", "failed", "not_started")
    assert settlement_events(intent) == ["submit_ok", "query_timeout", "query_found_failed"]
    assert chain.balance(payer.address) == before
    assert upstream.calls == []
    assert tx_of(intent).broadcast_attempts == 1  # expired: nothing sent again


def test_shallow_reorg_before_the_depth_is_not_confirmed_and_nothing_is_dispatched_twice(chain, upstream):
    w = world(chain, upstream, confirmations=2)
    payer = chain.payers[0]
    before = chain.balance(payer.address)
    intent = authorized_intent(w, payer)
    driven = drive(intent, wait=0.5)  # mined in one block: 1 of 2 confirmations
    assert driven.answer is None
    assert lines(intent) == ("authorized", "pending", "not_started")
    chain.reorg(1)  # the block with our transaction is replaced
    settlement_query(intent.intent_id, cause=CAUSE)
    assert lines(intent)[1] in ("pending", "unknown")
    assert upstream.calls == []
    chain.mine(2)
    drive(intent)
    if lines(intent)[1] != "confirmed":  # the reorg may have left it out: the same bytes are sent again
        chain.mine(2)
        drive(intent)
    assert lines(intent) == ("completed", "confirmed", "succeeded")
    assert chain.balance(payer.address) == before - w.amount
    assert len(upstream.calls) == 1
    assert len({t.tx_hash for t in ChainTransaction.objects.all()}) == 1


def test_a_reorg_deeper_than_the_depth_after_confirmed_is_a_finding_not_a_state_change(chain, upstream):
    chain.mine(3)  # the reorg stays above the fixture's snapshot, which it would otherwise cut away
    w = world(chain, upstream)
    payer = chain.payers[0]
    intent = authorized_intent(w, payer)
    assert drive(intent).answer.status == 200
    chain.reorg(2)
    finding = settlement_audit_confirmed(intent.intent_id)
    assert finding.kind != "confirmed"  # the chain no longer shows it where it was
    reconcile()
    assert lines(intent) == ("completed", "confirmed", "succeeded")  # terminal: never changes
    assert len(upstream.calls) == 1


def test_killed_between_persist_and_broadcast_the_job_sends_the_persisted_bytes(chain, upstream, monkeypatch):
    w = world(chain, upstream)
    payer = chain.payers[0]
    before = chain.balance(payer.address)
    intent = authorized_intent(w, payer)

    def killed(tx, *, now):
        raise SystemExit("the gateway process died after the commit")

    monkeypatch.setattr(settlement_module, "chain_tx_broadcast", killed)
    with pytest.raises(SystemExit):
        settlement_submit(intent.intent_id, cause=CAUSE)
    monkeypatch.undo()
    tx = tx_of(intent)
    assert tx.broadcast_attempts == 0 and lines(intent) == ("authorized", "not_started", "not_started")
    assert chain.balance(payer.address) == before
    run = reconcile()
    assert run.errors == 0, run.notes
    assert lines(intent)[1] == "submitted"
    assert tx_of(intent).tx_hash == tx.tx_hash and tx_of(intent).broadcast_attempts == 1
    agentpay_job_run("agentpay_onchain_reconcile", now=tx_of(intent).next_query_at + timedelta(seconds=0))
    assert drive(intent).answer.status == 200
    assert lines(intent) == ("completed", "confirmed", "succeeded")
    assert chain.balance(payer.address) == before - w.amount
    assert ChainTransaction.objects.count() == 1

