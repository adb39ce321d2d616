"""agentpay.chain.rpc against the real node, and through the fault proxy: a lost answer is
ChainTimeout (unknown), a node's error is ChainRejected, and "dropped after forward" really means
the node has the transaction."""

import json
import time

import pytest
from django.core.exceptions import ImproperlyConfigured
from eth_account import Account

from agentpay.chain import keys, rpc, token
from agentpay.chain.rpc import ChainRejected, ChainTimeout
from tests.support.rpc_proxy import RpcProxy


@pytest.fixture
def network(chain, db):
    return chain.make_network()


def _signed_transfer(chain, network, value: int = 3) -> tuple[str, str]:
    """A token transfer from payer 0, signed like settlement does: (raw hex, precomputed hash)."""
    payer = chain.payers[0]
    tx = {"nonce": rpc.transaction_count(network, payer.address), "gas": 100_000, "chainId": chain.chain_id,
          "maxFeePerGas": rpc.gas_price(network) * 2, "maxPriorityFeePerGas": 10**9,
          "to": chain.w3.to_checksum_address(chain.token_address), "value": 0,
          "data": token.transfer_calldata(chain.pay_to.address, value)}
    signed = Account.sign_transaction(tx, payer.key)
    return "0x" + signed.raw_transaction.hex(), "0x" + signed.hash.hex()


def test_wrappers_read_the_node(chain, network):
    raw, tx_hash = _signed_transfer(chain, network)
    assert rpc.send_raw_transaction(network, raw) == tx_hash
    chain.wait_receipt(tx_hash)  # anvil answers with the hash, then mines: under load the block comes a moment later
    receipt = rpc.get_receipt(network, tx_hash)
    assert receipt["status"] == 1 and receipt["transactionHash"] == tx_hash
    assert receipt["blockNumber"] == rpc.block_number(network)
    assert rpc.block_hash(network, receipt["blockNumber"]) == receipt["blockHash"].lower()
    assert rpc.block_hash(network, receipt["blockNumber"] + 100) is None
    tx = rpc.get_transaction(network, tx_hash)
    assert tx["from"] == chain.payers[0].address and tx["blockNumber"] == receipt["blockNumber"]
    assert rpc.transaction_count(network, chain.payers[0].address) == tx["nonce"] + 1
    assert rpc.get_receipt(network, "0x" + "ab" * 32) is None
    assert rpc.get_transaction(network, "0x" + "ab" * 32) is None
    assert rpc.chain_id(network) == chain.chain_id
    assert rpc.chain_time(network) == chain.latest_timestamp()


def test_pending_transaction_has_no_receipt_until_mined(chain, network):
    chain.set_automine(False)
    raw, tx_hash = _signed_transfer(chain, network)
    rpc.send_raw_transaction(network, raw)
    assert rpc.get_receipt(network, tx_hash) is None
    assert rpc.get_transaction(network, tx_hash)["blockNumber"] is None
    assert tx_hash in chain.pending_transactions()
    chain.mine()
    assert rpc.get_receipt(network, tx_hash)["status"] == 1


def test_node_error_is_rejected_with_its_message(chain, network):
    raw, _ = _signed_transfer(chain, network)
    rpc.send_raw_transaction(network, raw)
    # The same bytes again after they were mined: the node says nonce too low (our own tx landed).
    with pytest.raises(ChainRejected) as caught:
        rpc.send_raw_transaction(network, raw)
    assert caught.value.method == "eth_sendRawTransaction" and caught.value.message
    with pytest.raises(ChainRejected):
        rpc.send_raw_transaction(network, "0xdeadbeef")


def test_closed_port_is_timeout(chain, db):
    network = chain.make_network(rpc_url="http://127.0.0.1:9")
    with pytest.raises(ChainTimeout):
        rpc.block_number(network)


def test_broadcast_dropped_after_forward_reached_the_node(chain, network):
    raw, tx_hash = _signed_transfer(chain, network, value=11)
    with RpcProxy(chain.rpc_url) as proxy:
        network.rpc_url = proxy.url
        proxy.drop("eth_sendRawTransaction")
        with pytest.raises(ChainTimeout):
            rpc.send_raw_transaction(network, raw)
        assert proxy.dropped == ["eth_sendRawTransaction"] and proxy.forwarded == ["eth_sendRawTransaction"]
        # We never heard, but the node has it: the receipt query (the rule used up) finds it.
        chain.wait_receipt(tx_hash)  # mined a moment after the node took it
        assert rpc.get_receipt(network, tx_hash)["status"] == 1
    assert chain.balance(chain.pay_to.address) == 11


def test_dropped_before_forward_never_reaches_the_node(chain, network):
    raw, tx_hash = _signed_transfer(chain, network)
    with RpcProxy(chain.rpc_url) as proxy:
        network.rpc_url = proxy.url
        proxy.drop("eth_sendRawTransaction", after_forward=False)
        with pytest.raises(ChainTimeout):
            rpc.send_raw_transaction(network, raw)
        assert proxy.forwarded == []
        assert rpc.get_transaction(network, tx_hash) is None
        assert proxy.calls == ["eth_sendRawTransaction", "eth_getTransactionByHash"]


def test_delay_past_the_timeout_is_timeout_and_clear_restores(chain, network):
    with RpcProxy(chain.rpc_url) as proxy:
        network.rpc_url = proxy.url
        network.rpc_timeout_seconds = 0.3
        proxy.delay("eth_blockNumber", 1.0)
        started = time.monotonic()
        with pytest.raises(ChainTimeout):
            rpc.block_number(network)
        assert time.monotonic() - started < 0.9
        proxy.clear()
        assert rpc.block_number(network) == chain.block_number()
        proxy.error("eth_gasPrice", "boom", code=-32005)
        with pytest.raises(ChainRejected, match="boom") as caught:
            rpc.gas_price(network)
        assert caught.value.code == -32005


def test_keys_come_from_the_setting(chain, settings):
    assert keys.private_key_for(chain.submitter.address.upper().replace("0X", "0x")) == chain.submitter.key
    settings.AGENTPAY_CHAIN_KEYS = json.dumps({chain.pay_to.address: chain.pay_to.key[2:]})
    assert keys.private_key_for(chain.pay_to.address) == chain.pay_to.key
    with pytest.raises(ImproperlyConfigured, match=chain.submitter.address):
        keys.private_key_for(chain.submitter.address)
    settings.AGENTPAY_CHAIN_KEYS = "{not json"
    with pytest.raises(ImproperlyConfigured, match="not valid JSON"):
        keys.private_key_for(chain.pay_to.address)
