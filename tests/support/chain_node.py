"""The chain node behind tests/support/chain.py's fixtures: where anvil is (installing it with
bin/_chain.sh when missing), starting it on a free loopback port, or else the eth-tester
fallback, loudly; then the fixed test accounts funded, the token deployed from the committed
artifact and the payers minted."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from eth_account import Account
from eth_utils import keccak, to_checksum_address

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
    # Type 2 (EIP-1559): eth-tester cannot mine a pending legacy EIP-155 transaction once
    # automine is off (it re-validates v as a uint8), so the fallback needs typed transactions.
    tx = {"nonce": nonce, "gas": gas, "maxFeePerGas": gas_price * 2, "maxPriorityFeePerGas": 10**9,
          "value": value, "data": data, "chainId": int(rpc_call(url, "eth_chainId"), 16)}
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

def _stop_process(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


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
        if self.process is not None:
            _stop_process(self.process)
        if self.fallback is not None:
            self.fallback.stop()


def _die_with_parent() -> None:
    """In the child before exec: if the pytest worker is killed outright (no teardown runs), the
    kernel sends anvil SIGTERM too, so no node outlives its test run (Linux; elsewhere the
    fixture's finally and atexit stop it)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def start_anvil(anvil: str, extra_args: tuple[str, ...] = ()) -> ChainNode:
    port = _free_port()
    log = tempfile.NamedTemporaryFile(prefix="anvil-", suffix=".log", delete=False)  # noqa: SIM115
    # --block-time unset: automine, each transaction in its own block at once. --accounts 0: our
    # own fixed accounts are funded below.
    process = subprocess.Popen(
        [anvil, "--host", "127.0.0.1", "--port", str(port), "--chain-id", str(CHAIN_ID), "--accounts", "1",
         "--balance", "1", "--gas-price", "1000000000", "--no-request-size-limit", *extra_args],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)  # noqa: PLW1509
    atexit.register(_stop_process, process)
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


