"""The local chain for the on-chain tests (issue 18): one anvil per pytest-xdist worker, the
EIP-3009 token deployed from the committed artifact, payers minted, and a snapshot/revert around
every test so each test starts from the same chain.

    def test_x(chain):            # function-scoped; `chain_node` is the session's node
        network = chain.make_network()          # the ChainNetwork row (needs `db`)
        auth = chain.sign_authorization(chain.payers[0], to=chain.pay_to, value=10_000)
        chain.set_automine(False); ...; chain.mine()

anvil comes from npm (bin/_chain.sh, pinned; bin/test sources it). When it is not installed the
first worker installs it with the same script; when that fails, or anvil will not start, the
node is eth-tester + py-evm behind a loopback JSON-RPC server (tests/support/eth_tester_rpc.py),
so product code still talks HTTP. That is said loudly (stderr and the terminal summary), and
`chain.require_anvil(...)` skips a test that needs an anvil-only method, naming why.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Any

import pytest
import requests
from eth_account import Account
from eth_account.messages import encode_typed_data
from eth_utils import to_checksum_address
from web3 import HTTPProvider, Web3

from agentpay.models.chain import ChainNetwork
from tests.support.chain_node import (
    CHAIN_ID,
    DEPLOYER,
    FALLBACK_REASONS,
    MINTED_PER_PAYER,
    PAY_TO,
    PAYERS,
    SUBMITTER,
    ChainNode,
    RpcError,
    TestAccount,
    find_anvil,
    rpc_call,
    send_tx,
    start_node,
    wait_receipt,
)

__all__ = ["Chain", "ChainNode", "TestAccount", "chain", "chain_node", "find_anvil", "rpc_call", "start_node"]


# ---- what a test gets -------------------------------------------------------------------------

@dataclass
class Chain:
    """The handle a test drives the chain with (see the module docstring)."""

    node: ChainNode
    settings: Any
    chain_id: int = CHAIN_ID
    token_name: str = "USD Coin"
    token_version: str = "2"
    decimals: int = 6
    deployer: TestAccount = DEPLOYER
    submitter: TestAccount = SUBMITTER
    pay_to: TestAccount = PAY_TO
    payers: tuple[TestAccount, ...] = PAYERS
    minted_per_payer: int = MINTED_PER_PAYER
    _w3: Web3 | None = field(default=None, repr=False)

    @property
    def kind(self) -> str:
        return self.node.kind

    @property
    def rpc_url(self) -> str:
        return self.node.rpc_url

    @property
    def token_address(self) -> str:
        return self.node.token_address

    @property
    def w3(self) -> Web3:
        if self._w3 is None:
            self._w3 = Web3(HTTPProvider(self.rpc_url, request_kwargs={"timeout": 10}))
        return self._w3

    @property
    def keys(self) -> dict[str, str]:
        """address → key for every account the product may sign for (AGENTPAY_CHAIN_KEYS)."""
        return {a.address: a.key for a in (self.submitter, self.pay_to, self.deployer)}

    def rpc(self, method: str, params: list[Any] | None = None) -> Any:
        return rpc_call(self.rpc_url, method, params)

    def require_anvil(self, what: str) -> None:
        """Skip (loudly, with the reason) a test that needs an anvil-only method."""
        if self.kind != "anvil":
            pytest.skip(f"needs anvil for {what}; anvil is unavailable: {self.node.why_not_anvil}")

    def make_network(self, **overrides: Any) -> ChainNetwork:
        fields = {"caip2": f"eip155:{self.chain_id}", "name": f"local {self.kind}", "chain_id": self.chain_id,
                  "rpc_url": self.rpc_url, "rpc_timeout_seconds": 2.0, "confirmations": 1,
                  "token_address": self.token_address, "token_name": self.token_name,
                  "token_version": self.token_version, "token_decimals": self.decimals,
                  "pay_to": self.pay_to.address, "submitter": self.submitter.address}
        fields.update(overrides)
        return ChainNetwork.objects.create(**fields)

    # -- mining and time --
    def block_number(self) -> int:
        return int(self.rpc("eth_blockNumber"), 16)

    def mine(self, n: int = 1) -> None:
        if self.kind == "anvil":
            self.rpc("anvil_mine", [hex(n)])
        else:
            for _ in range(n):
                self.rpc("evm_mine")

    def set_automine(self, enabled: bool) -> None:
        self.rpc("evm_setAutomine", [enabled])

    def set_block_time(self, seconds: float | None) -> None:
        """Interval mining every `seconds`; None: back to automine (the fixture's default)."""
        self.require_anvil("interval mining (evm_setIntervalMining)")
        if seconds is None:
            self.rpc("evm_setIntervalMining", [0])
            self.rpc("evm_setAutomine", [True])
        else:
            self.rpc("evm_setAutomine", [False])
            self.rpc("evm_setIntervalMining", [seconds])

    def increase_time(self, seconds: int) -> None:
        """Move the chain's clock (the next block's timestamp) forward."""
        self.rpc("evm_increaseTime", [int(seconds)])

    def set_next_block_timestamp(self, timestamp: int) -> None:
        self.rpc("evm_setNextBlockTimestamp", [int(timestamp)])

    def latest_timestamp(self) -> int:
        return int(self.rpc("eth_getBlockByNumber", ["latest", False])["timestamp"], 16)

    # -- faults --
    def drop_transaction(self, tx_hash: str) -> None:
        """Remove a pending transaction from the node's pool, as a node that lost it would."""
        self.require_anvil("anvil_dropTransaction")
        self.rpc("anvil_dropTransaction", [tx_hash])

    def snapshot(self) -> str:
        return self.rpc("evm_snapshot")

    def revert(self, snapshot_id: str) -> None:
        if not self.rpc("evm_revert", [snapshot_id]):
            raise RpcError(f"evm_revert({snapshot_id}) answered false")

    def reorg(self, depth: int, transactions: list[tuple[str, int]] | None = None) -> None:
        """Replace the last `depth` blocks with as many new ones (anvil_reorg): their
        transactions are gone from the canonical chain unless listed in `transactions` as
        (raw signed tx hex, offset of the new block it goes in, 0 = the first)."""
        self.require_anvil("anvil_reorg")
        self.rpc("anvil_reorg", [depth, [[raw, offset] for raw, offset in (transactions or [])]])

    def pending_transactions(self) -> list[str]:
        block = self.rpc("eth_getBlockByNumber", ["pending", False])
        return [tx.lower() for tx in (block or {}).get("transactions", [])]

    # -- money --
    def balance(self, address: str) -> int:
        """Token units held by `address` at the latest block."""
        data = "0x70a08231" + "00" * 12 + address.lower().removeprefix("0x")
        return int(self.rpc("eth_call", [{"to": to_checksum_address(self.token_address), "data": data},
                                         "latest"]), 16)

    def eth_balance(self, address: str) -> int:
        return int(self.rpc("eth_getBalance", [to_checksum_address(address), "latest"]), 16)

    def send(self, account: TestAccount, *, to: str, data: str = "0x", value: int = 0, gas: int = 300_000) -> str:
        return send_tx(self.rpc_url, account, to=to, data=data, value=value, gas=gas)

    def wait_receipt(self, tx_hash: str, timeout: float = 10) -> dict:
        return wait_receipt(self.rpc_url, tx_hash, timeout=timeout)

    def sign_authorization(self, payer: TestAccount, *, value: int, to: str | None = None, valid_after: int = 0,
                           valid_before: int | None = None, nonce: str | None = None,
                           primary_type: str = "TransferWithAuthorization") -> dict[str, Any]:
        """An EIP-3009 authorization signed by `payer` for this chain's token: from, to, value,
        validAfter, validBefore, nonce (32-byte hex), signature (65-byte hex r‖s‖v)."""
        to = (to or self.pay_to.address).lower()
        valid_before = self.latest_timestamp() + 3600 if valid_before is None else valid_before
        nonce = nonce or "0x" + os.urandom(32).hex()
        message = {"from": to_checksum_address(payer.address), "to": to_checksum_address(to), "value": value,
                   "validAfter": valid_after, "validBefore": valid_before, "nonce": bytes.fromhex(nonce[2:])}
        typed = {
            "types": {
                "EIP712Domain": [{"name": "name", "type": "string"}, {"name": "version", "type": "string"},
                                 {"name": "chainId", "type": "uint256"},
                                 {"name": "verifyingContract", "type": "address"}],
                primary_type: [{"name": "from", "type": "address"}, {"name": "to", "type": "address"},
                               {"name": "value", "type": "uint256"}, {"name": "validAfter", "type": "uint256"},
                               {"name": "validBefore", "type": "uint256"}, {"name": "nonce", "type": "bytes32"}],
            },
            "primaryType": primary_type,
            "domain": {"name": self.token_name, "version": self.token_version, "chainId": self.chain_id,
                       "verifyingContract": to_checksum_address(self.token_address)},
            "message": message,
        }
        signed = Account.sign_message(encode_typed_data(full_message=typed), payer.key)
        return {"from": payer.address, "to": to, "value": str(value), "validAfter": str(valid_after),
                "validBefore": str(valid_before), "nonce": nonce, "signature": "0x" + signed.signature.hex()}


# ---- fixtures ---------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def chain_node():
    """The session's node (one per xdist worker: each worker is its own session)."""
    node = start_node()
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture
def chain(chain_node, settings):
    """The chain for one test, rolled back to the session's deployed state afterwards."""
    snapshot_id = rpc_call(chain_node.rpc_url, "evm_snapshot")
    settings.AGENTPAY_CHAIN_KEYS = {a.address: a.key for a in (SUBMITTER, PAY_TO, DEPLOYER)}
    handle = Chain(node=chain_node, settings=settings)
    try:
        yield handle
    finally:
        _restore(chain_node, snapshot_id)


def _restore(node: ChainNode, snapshot_id: str) -> None:
    # A revert restores state, not the mining mode or the pool: put both back first, so a test
    # that paused mining or left a pending transaction does not leak it into the next test.
    url = node.rpc_url
    with contextlib.suppress(RpcError, requests.RequestException):
        if node.kind == "anvil":
            rpc_call(url, "evm_setIntervalMining", [0])
            rpc_call(url, "anvil_dropAllTransactions")
        rpc_call(url, "evm_setAutomine", [True])
        if node.kind != "anvil":
            # eth-tester keeps its pending block across a revert: mine it into the block the
            # revert then removes.
            rpc_call(url, "evm_mine")
    if not rpc_call(url, "evm_revert", [snapshot_id]):
        raise RpcError(f"could not revert the chain to snapshot {snapshot_id}")


def pytest_terminal_summary(terminalreporter):
    """Say it once more at the end, where nobody misses it."""
    reasons = set(FALLBACK_REASONS)
    # Under xdist the workers ran the fixture; the controller checks the same way they did.
    if (not reasons and not hasattr(terminalreporter.config, "workerinput")
            and getattr(terminalreporter.config.option, "numprocesses", None)):
        _, why = find_anvil(install=False)
        if why:
            reasons.add(why)
    for why in sorted(reasons):
        terminalreporter.write_sep("!", "on-chain tests ran on the eth-tester FALLBACK, not anvil", red=True)
        terminalreporter.write_line(f"reason: {why}", red=True)
