"""The chain handle's fault helpers behave as the settlement fault tests rely on: a dropped
transaction is gone from the node, a reorg removes a mined transaction from the canonical chain
(and can put the same bytes back), interval mining mines on its own, the chain's clock moves."""

import time

import pytest
import requests
from eth_account import Account

from agentpay.chain import rpc, token
from tests.support.chain_node import ChainNode, fund_and_deploy, rpc_call
from tests.support.eth_tester_rpc import EthTesterRpcServer


@pytest.fixture
def network(chain, db):
    return chain.make_network()


def _signed(chain, network, value: int = 1) -> tuple[str, str]:
    payer = chain.payers[2]
    tx = {"nonce": rpc.transaction_count(network, payer.address), "gas": 100_000, "chainId": chain.chain_id,
          "maxFeePerGas": rpc.gas_price(network) * 2, "maxPriorityFeePerGas": 10**9,
          "to": chain.w3.to_checksum_address(chain.token_address), "value": 0,
          "data": token.transfer_calldata(chain.pay_to.address, value)}
    signed = Account.sign_transaction(tx, payer.key)
    return "0x" + signed.raw_transaction.hex(), "0x" + signed.hash.hex()


def _mined(network, tx_hash: str) -> dict:
    """The receipt of a transaction sent under automine: anvil mines it in a task of its own, so on
    a loaded machine the receipt can lag the send by a moment (CI once read None right after it)."""
    deadline = time.monotonic() + 10
    while (receipt := rpc.get_receipt(network, tx_hash)) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert receipt is not None, f"{tx_hash} was not mined within 10 s under automine"
    return receipt


def test_drop_transaction_forgets_a_pending_one(chain, network):
    chain.require_anvil("anvil_dropTransaction")
    chain.set_automine(False)
    raw, tx_hash = _signed(chain, network)
    rpc.send_raw_transaction(network, raw)
    assert rpc.get_transaction(network, tx_hash) is not None
    chain.drop_transaction(tx_hash)
    assert rpc.get_transaction(network, tx_hash) is None
    chain.mine()
    assert rpc.get_receipt(network, tx_hash) is None
    # The same bytes can be broadcast again and land: the only retransmission settlement makes.
    assert rpc.send_raw_transaction(network, raw) == tx_hash
    chain.mine()
    assert rpc.get_receipt(network, tx_hash)["status"] == 1
    assert chain.balance(chain.pay_to.address) == 1


@pytest.mark.parametrize("depth", [1, 3])
def test_reorg_removes_a_mined_transaction_then_the_same_bytes_return(chain, network, depth):
    chain.require_anvil("anvil_reorg")
    raw, tx_hash = _signed(chain, network, value=9)
    rpc.send_raw_transaction(network, raw)
    receipt = _mined(network, tx_hash)
    chain.mine(depth - 1)  # the tx is now `depth` blocks deep
    head = chain.block_number()
    chain.reorg(depth)
    assert chain.block_number() == head
    assert rpc.block_hash(network, receipt["blockNumber"]) != receipt["blockHash"]
    assert rpc.get_receipt(network, tx_hash) is None
    assert chain.balance(chain.pay_to.address) == 0
    # A reorg that re-includes the same bytes in its first new block.
    chain.reorg(1, [(raw, 0)])
    again = rpc.get_receipt(network, tx_hash)
    assert again["status"] == 1 and again["blockNumber"] == head
    assert chain.balance(chain.pay_to.address) == 9


def test_interval_mining_then_back_to_automine(chain, network):
    chain.require_anvil("evm_setIntervalMining")
    chain.set_block_time(1)
    raw, tx_hash = _signed(chain, network)
    rpc.send_raw_transaction(network, raw)
    assert rpc.get_receipt(network, tx_hash) is None
    deadline = time.monotonic() + 5
    while rpc.get_receipt(network, tx_hash) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert rpc.get_receipt(network, tx_hash)["status"] == 1
    chain.set_block_time(None)
    raw, tx_hash = _signed(chain, network)
    rpc.send_raw_transaction(network, raw)
    assert rpc.get_receipt(network, tx_hash)["status"] == 1


def test_chain_clock_moves_forward(chain, network):
    before = chain.latest_timestamp()
    chain.increase_time(7200)
    chain.mine()
    assert chain.latest_timestamp() >= before + 7200
    assert rpc.chain_time(network) == chain.latest_timestamp()


def test_the_fallback_node_serves_the_rail_even_when_anvil_is_here():
    # The fallback is exercised on every run, not only on machines without anvil.
    server = EthTesterRpcServer(chain_id=31337).start()
    try:
        node = ChainNode(kind="eth-tester", rpc_url=server.url, fallback=server)
        fund_and_deploy(node)
        assert int(rpc_call(server.url, "eth_chainId"), 16) == 31337
        balance = rpc_call(server.url, "eth_call", [{"to": node.token_address,
                                                     "data": "0x70a08231" + "00" * 12 + node.token_address[2:]},
                                                    "latest"])
        assert int(balance, 16) == 0
        answer = requests_post(server.url, "anvil_reorg", [1, []])
        assert answer["error"]["code"] == -32601 and "eth-tester fallback" in answer["error"]["message"]
    finally:
        server.stop()


def requests_post(url: str, method: str, params: list) -> dict:
    return requests.post(url, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, timeout=10).json()
