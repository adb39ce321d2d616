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
import fcntl
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
from eth_account import Account
from eth_account.messages import encode_typed_data
from eth_utils import keccak, to_checksum_address
from web3 import HTTPProvider, Web3

from agentpay.chain import token

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "chain"
CHAIN_ID = 31337
TOKEN_UNITS = 10**6
MINTED_PER_PAYER = 1_000 * TOKEN_UNITS
ETH = 10**18
PAYER_COUNT = 4


def _key(label: str) -> str:
    # Fixed keys, so addresses are the same on every run and every worker (test-only, never funded
    # anywhere real).
    return "0x" + keccak(text=f"agentpay-test-chain:{label}").hex()


@dataclass(frozen=True)
class TestAccount:
    address: str  # lowercase, as the models store it
    key: str

    @classmethod
    def named(cls, label: str) -> TestAccount:
        key = _key(label)
        return cls(address=Account.from_key(key).address.lower(), key=key)

    @property
    def checksum(self) -> str:
        return Account.from_key(self.key).address


DEPLOYER = TestAccount.named("deployer")
SUBMITTER = TestAccount.named("submitter")
PAY_TO = TestAccount.named("pay_to")
PAYERS = tuple(TestAccount.named(f"payer{i}") for i in range(PAYER_COUNT))


# ---- where anvil is -------------------------------------------------------------------------

def _platform_dir() -> str | None:
    system = {"Linux": "linux", "Darwin": "darwin"}.get(platform.system())
    machines = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
    machine = machines.get(platform.machine().lower())
    return f"{system}-{machine}" if system and machine else None


def _cached_anvil() -> Path | None:
    plat = _platform_dir()
    if plat is None:
        return None
    path = CACHE / "node_modules" / "@foundry-rs" / f"anvil-{plat}" / "bin" / "anvil"
    return path if os.access(path, os.X_OK) else None


def find_anvil(*, install: bool = True) -> tuple[str | None, str]:
    """(path to anvil, "") or (None, why not). Installs it with bin/_chain.sh when missing (once,
    under a file lock, so two xdist workers do not both run npm)."""
    unavailable = os.environ.get("AGENTPAY_CHAIN_UNAVAILABLE")
    if unavailable:
        return None, unavailable
    explicit = os.environ.get("AGENTPAY_ANVIL_BIN")
    if explicit:
        if os.access(explicit, os.X_OK):
            return explicit, ""
        return None, f"AGENTPAY_ANVIL_BIN={explicit} is not executable"
    found = _cached_anvil() or shutil.which("anvil")
    if found:
        return str(found), ""
    if not install:
        return None, "anvil is not installed (run bin/test, or `. bin/_chain.sh && chain_tools_ensure .`)"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _cached_anvil() is None:
            proc = subprocess.run(["bash", "-c", '. bin/_chain.sh && chain_tools_ensure "$PWD" && '
                                   'echo "UNAVAILABLE=${AGENTPAY_CHAIN_UNAVAILABLE:-}"'],
                                  cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
            sys.stderr.write(proc.stdout + proc.stderr)
    found = _cached_anvil()
    if found:
        return str(found), ""
    return None, "installing @foundry-rs/anvil from npm failed (see bin/_chain.sh's message above)"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---- JSON-RPC ---------------------------------------------------------------------------------

class RpcError(Exception):
    pass


def rpc_call(url: str, method: str, params: list[Any] | None = None, *, timeout: float = 10) -> Any:
    answer = requests.post(url, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params or []},
                           timeout=timeout).json()
    if "error" in answer:
        raise RpcError(f"{method}: {answer['error']}")
    return answer["result"]


def send_tx(url: str, account: TestAccount, *, to: str | None, data: str = "0x", value: int = 0,
            gas: int = 3_000_000) -> str:
    """Sign and broadcast a plain transaction from a test account (fixture set-up, not the product)."""
    nonce = int(rpc_call(url, "eth_getTransactionCount", [account.checksum, "pending"]), 16)
    gas_price = int(rpc_call(url, "eth_gasPrice"), 16)
    tx = {"nonce": nonce, "gas": gas, "gasPrice": gas_price * 2, "value": value, "data": data,
          "chainId": int(rpc_call(url, "eth_chainId"), 16)}
    if to is not None:
        tx["to"] = Account.from_key(account.key).address if to == account.address else to_checksum_address(to)
    signed = Account.sign_transaction(tx, account.key)
    return rpc_call(url, "eth_sendRawTransaction", ["0x" + signed.raw_transaction.hex()])


def wait_receipt(url: str, tx_hash: str, *, timeout: float = 10) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        receipt = rpc_call(url, "eth_getTransactionReceipt", [tx_hash])
        if receipt is not None:
            return receipt
        time.sleep(0.02)
    raise TimeoutError(f"no receipt for {tx_hash} in {timeout}s")


# ---- the node ---------------------------------------------------------------------------------

@dataclass
class ChainNode:
    """One running node: anvil (a subprocess) or the eth-tester fallback (a thread)."""

    kind: str
    rpc_url: str
    why_not_anvil: str = ""
    token_address: str = ""
    process: subprocess.Popen | None = None
    fallback: Any = None
    log_path: str = ""
    base_snapshot: str = ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        if self.fallback is not None:
            self.fallback.stop()


def start_anvil(anvil: str, extra_args: tuple[str, ...] = ()) -> ChainNode:
    """anvil on a free loopback port (`extra_args`, e.g. ("--block-time", "1"), go after ours)."""
    port = _free_port()
    log = tempfile.NamedTemporaryFile(prefix="anvil-", suffix=".log", delete=False)  # noqa: SIM115
    # --block-time unset: automine, each transaction in its own block at once. --accounts 0: our
    # own fixed accounts are funded below.
    process = subprocess.Popen(
        [anvil, "--host", "127.0.0.1", "--port", str(port), "--chain-id", str(CHAIN_ID), "--accounts", "1",
         "--balance", "1", "--gas-price", "1000000000", "--no-request-size-limit", *extra_args],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    node = ChainNode(kind="anvil", rpc_url=f"http://127.0.0.1:{port}", process=process, log_path=log.name)
    deadline = time.monotonic() + 20
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"anvil exited with {process.returncode}: {Path(log.name).read_text()[-2000:]}")
        try:
            rpc_call(node.rpc_url, "eth_chainId", timeout=1)
            return node
        except (requests.RequestException, ValueError):
            if time.monotonic() > deadline:
                node.stop()
                raise RuntimeError(f"anvil did not answer on {node.rpc_url} in 20 s") from None
            time.sleep(0.05)


def fund_and_deploy(node: ChainNode) -> None:
    """ETH for our accounts, the token from the committed artifact, token units to each payer."""
    url = node.rpc_url
    accounts = (DEPLOYER, SUBMITTER, PAY_TO, *PAYERS)
    if node.kind == "anvil":
        for account in accounts:
            rpc_call(url, "anvil_setBalance", [account.checksum, hex(1_000 * ETH)])
    else:
        node.fallback.fund([a.address for a in accounts], 1_000 * ETH)
    receipt = wait_receipt(url, send_tx(url, DEPLOYER, to=None, data=token.bytecode(), gas=5_000_000))
    if int(receipt["status"], 16) != 1:
        raise RuntimeError(f"token deployment reverted: {receipt}")
    node.token_address = receipt["contractAddress"].lower()
    for payer in PAYERS:
        wait_receipt(url, send_tx(url, DEPLOYER, to=node.token_address,
                                  data=token.mint_calldata(payer.address, MINTED_PER_PAYER)))


def start_node() -> ChainNode:
    anvil, why = find_anvil()
    node = None
    if anvil:
        try:
            node = start_anvil(anvil)
        except (RuntimeError, OSError) as exc:
            why = f"anvil at {anvil} would not start: {exc}"
    if node is None:
        _warn_fallback(why)
        from tests.support.eth_tester_rpc import EthTesterRpcServer

        server = EthTesterRpcServer(chain_id=CHAIN_ID)
        server.start()
        node = ChainNode(kind="eth-tester", rpc_url=server.url, why_not_anvil=why, fallback=server)
    try:
        fund_and_deploy(node)
        node.base_snapshot = rpc_call(node.rpc_url, "evm_snapshot")
    except BaseException:
        node.stop()
        raise
    return node


FALLBACK_REASONS: list[str] = []


def _warn_fallback(why: str) -> None:
    FALLBACK_REASONS.append(why)
    sys.stderr.write(f"\n!!! on-chain tests: anvil unavailable ({why}); FALLING BACK to eth-tester + py-evm "
                     "behind a loopback JSON-RPC server; anvil-only tests will skip, naming why\n")


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

    def make_network(self, **overrides: Any):
        from agentpay.models.chain import ChainNetwork

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
