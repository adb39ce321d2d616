"""The fallback chain (issue 18: "if anvil cannot install ... fall back to an in-process chain"):
eth-tester + py-evm behind a loopback JSON-RPC HTTP server, so the product code under test still
talks HTTP JSON-RPC exactly as it does to anvil.

It answers the methods the rail and the fixture use (eth_* reads, eth_sendRawTransaction,
eth_call, eth_getLogs, evm_snapshot / evm_revert / evm_mine / evm_setAutomine / evm_increaseTime /
evm_setNextBlockTimestamp) and nothing else: an anvil-only method (anvil_reorg,
anvil_dropTransaction, interval mining) is a JSON-RPC "method not found", and the fixture skips
such tests loudly before they get here. One lock serialises py-evm, which is not thread-safe.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from eth_tester import EthereumTester, PyEVMBackend
from eth_tester.exceptions import BlockNotFound, TransactionFailed, TransactionNotFound, ValidationError

_NAMED = {"latest", "pending", "earliest", "safe", "finalized"}


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(part.title() for part in rest)


def to_json_rpc(value: Any) -> Any:
    """eth-tester's python values → JSON-RPC's: camelCase keys, ints as hex quantities."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return hex(value)
    if isinstance(value, bytes | bytearray):
        return "0x" + bytes(value).hex()
    if isinstance(value, dict):
        return {_camel(k): to_json_rpc(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json_rpc(v) for v in value]
    return value


def _block(tag: Any) -> int | str:
    if isinstance(tag, str) and tag in _NAMED:
        return "latest" if tag in ("safe", "finalized") else tag
    return int(tag, 16) if isinstance(tag, str) else int(tag)


def _int(value: Any) -> int:
    return int(value, 16) if isinstance(value, str) else int(value)


class RpcFailure(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class EthTesterRpcServer:
    def __init__(self, *, chain_id: int = 31337) -> None:
        backend = PyEVMBackend()
        # py-evm builds its ChainContext from the class attribute on every VM, and eth-tester
        # creates this chain class per backend, so setting it here changes this chain only.
        type(backend.chain).chain_id = chain_id
        self.chain_id = chain_id
        self.tester = EthereumTester(backend=backend)
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._sent: list[str] = []
        self.methods: dict[str, Callable[..., Any]] = {
            "eth_chainId": lambda: hex(self.chain_id),
            "net_version": lambda: str(self.chain_id),
            "eth_blockNumber": lambda: hex(self.tester.get_block_by_number("latest")["number"]),
            "eth_getBlockByNumber": self._get_block,
            "eth_getBlockByHash": lambda h, full=False: self._or_none(self.tester.get_block_by_hash, h, full),
            "eth_sendRawTransaction": self._send_raw,
            "eth_getTransactionReceipt": lambda h: self._or_none(self.tester.get_transaction_receipt, h),
            "eth_getTransactionByHash": lambda h: self._or_none(self.tester.get_transaction_by_hash, h),
            "eth_getTransactionCount": lambda a, b="latest": hex(self.tester.get_nonce(a, _block(b))),
            "eth_getBalance": lambda a, b="latest": hex(self.tester.get_balance(a, _block(b))),
            "eth_getCode": lambda a, b="latest": self.tester.get_code(a, _block(b)),
            "eth_gasPrice": self._gas_price,
            "eth_maxPriorityFeePerGas": lambda: hex(10**9),
            "eth_call": lambda tx, b="latest": self._execute(self.tester.call, tx, _block(b)),
            "eth_estimateGas": lambda tx, b="latest": hex(self._execute(self.tester.estimate_gas, tx, _block(b))),
            "eth_getLogs": self._get_logs,
            "evm_snapshot": lambda: hex(self.tester.take_snapshot()),
            "evm_revert": self._revert,
            "evm_mine": lambda *_: (self.tester.mine_blocks(1), "0x0")[1],
            "evm_setAutomine": self._set_automine,
            "evm_increaseTime": self._increase_time,
            "evm_setNextBlockTimestamp": lambda ts: (self.tester.time_travel(_int(ts)), None)[1],
        }

    # -- methods --
    @staticmethod
    def _or_none(fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except (TransactionNotFound, BlockNotFound):
            return None

    def _get_block(self, tag: Any, full: bool = False) -> Any:
        block = self._or_none(self.tester.get_block_by_number, _block(tag), full)
        if tag == "pending" and block is not None and not full:
            # eth-tester's pending block lists no transactions; anvil's does. Ours: what was sent
            # and is still known to the chain without a block.
            block = dict(block, transactions=[h for h in self._sent if self._is_pending(h)])
        return block

    def _is_pending(self, tx_hash: str) -> bool:
        tx = self._or_none(self.tester.get_transaction_by_hash, tx_hash)
        return tx is not None and tx["block_number"] is None

    def _send_raw(self, raw: str) -> str:
        try:
            tx_hash = self.tester.send_raw_transaction(raw)
        except ValidationError as exc:
            raise RpcFailure(-32003, str(exc)) from exc
        self._sent.append(tx_hash)
        del self._sent[:-1000]
        return tx_hash

    def _gas_price(self) -> str:
        return hex(self.tester.get_block_by_number("pending")["base_fee_per_gas"] + 10**9)

    def _call_tx(self, tx: dict) -> dict:
        out: dict[str, Any] = {}
        for key, value in tx.items():
            if key in ("gas", "value", "gasPrice", "maxFeePerGas", "maxPriorityFeePerGas", "nonce"):
                value = _int(value)
            if key == "input":
                key = "data"
            out[re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()] = value
        # A read-only call from nobody still pays gas in py-evm: call from the prefunded account.
        out.setdefault("from", self.tester.get_accounts()[0])
        out.setdefault("gas", 10_000_000)
        return out

    def _execute(self, fn: Callable[..., Any], tx: dict, block: int | str) -> Any:
        try:
            return fn(self._call_tx(tx), block)
        except TransactionFailed as exc:
            reason = str(exc.args[0]) if exc.args else "execution reverted"
            if not reason.startswith("execution reverted"):
                reason = f"execution reverted: {reason}"
            raise RpcFailure(3, reason) from exc

    def _get_logs(self, query: dict) -> Any:
        from_block = _block(query.get("fromBlock", "earliest"))
        to_block = _block(query.get("toBlock", "latest"))
        latest = self.tester.get_block_by_number("latest")["number"]
        return self.tester.get_logs(from_block=0 if from_block == "earliest" else
                                    latest if from_block in ("latest", "pending") else from_block,
                                    to_block=latest if isinstance(to_block, str) else to_block,
                                    address=query.get("address"), topics=query.get("topics"))

    def _revert(self, snapshot_id: Any) -> bool:
        self.tester.revert_to_snapshot(_int(snapshot_id))
        return True

    def _set_automine(self, enabled: bool) -> bool:
        if enabled:
            self.tester.enable_auto_mine_transactions()
        else:
            self.tester.disable_auto_mine_transactions()
        return True

    def _increase_time(self, seconds: Any) -> str:
        pending = self.tester.get_block_by_number("pending")["timestamp"]
        self.tester.time_travel(pending + _int(seconds))
        return hex(_int(seconds))

    def fund(self, addresses: list[str], wei: int) -> None:
        """ETH for our fixed accounts from eth-tester's prefunded one (anvil: anvil_setBalance)."""
        with self._lock:
            source = self.tester.get_accounts()[0]
            for address in addresses:
                self.tester.send_transaction({"from": source, "to": address, "value": wei, "gas": 21_000,
                                              "max_fee_per_gas": 10**11, "max_priority_fee_per_gas": 10**9})

    def handle(self, request: dict) -> dict:
        request_id = request.get("id")
        method = self.methods.get(request.get("method", ""))
        if method is None:
            return {"jsonrpc": "2.0", "id": request_id,
                    "error": {"code": -32601, "message": f"method not found on the eth-tester fallback: "
                                                         f"{request.get('method')}"}}
        try:
            with self._lock:
                result = method(*request.get("params", []))
        except RpcFailure as exc:
            return {"jsonrpc": "2.0", "id": request_id, "error": {"code": exc.code, "message": exc.message}}
        except (ValidationError, ValueError, TypeError, KeyError) as exc:
            return {"jsonrpc": "2.0", "id": request_id, "error": {"code": -32602, "message": str(exc)}}
        except Exception as exc:  # noqa: BLE001 - an answer, never a dead connection (that means "lost")
            message = f"eth-tester: {type(exc).__name__}: {exc}"
            return {"jsonrpc": "2.0", "id": request_id, "error": {"code": -32000, "message": message}}
        return {"jsonrpc": "2.0", "id": request_id, "result": to_json_rpc(result)}

    # -- HTTP --
    @property
    def url(self) -> str:
        assert self._server is not None, "not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> EthTesterRpcServer:
        node = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format, *args):  # noqa: A002 - the base class's name
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    request = json.loads(body)
                except ValueError:
                    answer: Any = {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "parse error"}}
                else:
                    answer = ([node.handle(r) for r in request] if isinstance(request, list)
                              else node.handle(request))
                content = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="eth-tester-rpc", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
