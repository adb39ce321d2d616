"""The JSON-RPC client of the on-chain rail: one place that turns "the node did not answer" and
"the node said no" into two different exceptions, because they mean opposite things for money.

- `ChainTimeout`: no answer in time, the connection dropped, a garbled or non-JSON answer, an
  HTTP error from something in between. The outcome is UNKNOWN: a broadcast may have reached the
  node. The caller records unknown and resolves it by queries, never by signing again.
- `ChainRejected`: the node answered with a JSON-RPC error (`.message`, `.code`, `.data`). Whether
  that is definite is the caller's business (an "already known" or "nonce too low" for our own
  persisted bytes is evidence they arrived, not a rejection).

The wrappers call the node through web3's HTTPProvider but read the raw JSON-RPC answer, so no
web3 result formatter can raise something else in between; quantities come back as ints, hashes
and addresses as 0x-hex strings (lowercase addresses, as the models store them). No retries
inside: web3's automatic retry is switched off, since a retried send is a second broadcast the
caller never counted, and a retried query only hides how long the node took.
"""

from __future__ import annotations

from typing import Any

import requests
from web3 import HTTPProvider, Web3
from web3.exceptions import ProviderConnectionError, TimeExhausted

from agentpay.models.chain import ChainNetwork


class ChainTimeout(Exception):
    """No usable answer from the node: the outcome is unknown."""


class ChainRejected(Exception):
    """The node answered with a JSON-RPC error."""

    def __init__(self, message: str, *, code: int | None = None, data: Any = None, method: str = "") -> None:
        super().__init__(f"{method}: {message}" if method else message)
        self.message = message
        self.code = code
        self.data = data
        self.method = method


# Fields of receipts, transactions, logs and blocks that JSON-RPC sends as hex quantities.
_QUANTITIES = frozenset({
    "blockNumber", "status", "gasUsed", "cumulativeGasUsed", "effectiveGasPrice", "transactionIndex",
    "logIndex", "nonce", "gas", "gasPrice", "value", "type", "chainId", "v", "maxFeePerGas",
    "maxPriorityFeePerGas", "number", "timestamp", "baseFeePerGas", "gasLimit", "yParity", "size",
    "blobGasUsed", "excessBlobGas", "difficulty",
})
_ADDRESSES = frozenset({"from", "to", "address", "contractAddress", "miner"})


def rpc_for(network: ChainNetwork, *, timeout: float | None = None) -> Web3:
    """A Web3 client for the network's node, with the network's timeout (or `timeout`)."""
    seconds = network.rpc_timeout_seconds if timeout is None else timeout
    provider = HTTPProvider(network.rpc_url, request_kwargs={"timeout": seconds},
                            exception_retry_configuration=None)
    return Web3(provider)


def call(network: ChainNetwork, method: str, params: list[Any] | None = None, *,
         timeout: float | None = None) -> Any:
    """One JSON-RPC call: the raw `result`, or ChainRejected / ChainTimeout."""
    provider = rpc_for(network, timeout=timeout).provider
    try:
        answer = provider.make_request(method, params or [])
    except (requests.RequestException, ProviderConnectionError, TimeExhausted, ValueError, OSError) as exc:
        # ValueError covers a body that is not JSON (requests' JSONDecodeError is both).
        raise ChainTimeout(f"{method}: no usable answer from {network.rpc_url}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(answer, dict):
        raise ChainTimeout(f"{method}: not a JSON-RPC answer from {network.rpc_url}: {answer!r:.200}")
    error = answer.get("error")
    if error is not None:
        if isinstance(error, dict):
            raise ChainRejected(str(error.get("message", error)), code=error.get("code"), data=error.get("data"),
                                method=method)
        raise ChainRejected(str(error), method=method)
    if "result" not in answer:
        raise ChainTimeout(f"{method}: JSON-RPC answer without result from {network.rpc_url}")
    return answer["result"]


def normalize(value: Any) -> Any:
    """Hex quantities → int, addresses → lowercase, recursively (receipts hold logs)."""
    if isinstance(value, list):
        return [normalize(item) for item in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key in _QUANTITIES and isinstance(item, str) and item.startswith("0x"):
            out[key] = int(item, 16)
        elif key in _ADDRESSES and isinstance(item, str):
            out[key] = item.lower()
        else:
            out[key] = normalize(item)
    return out


def _hex(value: str | bytes) -> str:
    if isinstance(value, bytes | bytearray):
        return "0x" + bytes(value).hex()
    return value if value.startswith("0x") else "0x" + value


def send_raw_transaction(network: ChainNetwork, raw_tx_hex: str) -> str:
    """Broadcast signed bytes; the node's tx hash (lowercase)."""
    return str(call(network, "eth_sendRawTransaction", [_hex(raw_tx_hex)])).lower()


def get_receipt(network: ChainNetwork, tx_hash: str) -> dict | None:
    """The receipt (status 1 success, 0 reverted; blockNumber, blockHash, logs), or None if the
    transaction is not in a block (pending, dropped, or never seen)."""
    result = call(network, "eth_getTransactionReceipt", [_hex(tx_hash)])
    return None if result is None else normalize(result)


def get_transaction(network: ChainNetwork, tx_hash: str) -> dict | None:
    """The transaction as the node knows it (blockNumber None while pending), or None if unknown."""
    result = call(network, "eth_getTransactionByHash", [_hex(tx_hash)])
    return None if result is None else normalize(result)


def block_number(network: ChainNetwork) -> int:
    return int(call(network, "eth_blockNumber"), 16)


def get_block(network: ChainNetwork, number: int | str = "latest") -> dict | None:
    """The block header (number, hash, timestamp, ...) without transaction bodies, or None."""
    tag = hex(number) if isinstance(number, int) else number
    result = call(network, "eth_getBlockByNumber", [tag, False])
    return None if result is None else normalize(result)


def block_hash(network: ChainNetwork, number: int) -> str | None:
    """The canonical hash at a height (None above the head): a receipt whose blockHash differs
    was reorganised away."""
    block = get_block(network, number)
    return None if block is None else str(block["hash"]).lower()


def chain_time(network: ChainNetwork) -> int:
    """The latest block's timestamp: the clock the token compares validBefore against."""
    block = get_block(network, "latest")
    if block is None:
        raise ChainTimeout("eth_getBlockByNumber(latest) answered null")
    return int(block["timestamp"])


def transaction_count(network: ChainNetwork, address: str, block: str = "pending") -> int:
    return int(call(network, "eth_getTransactionCount", [Web3.to_checksum_address(address), block]), 16)


def gas_price(network: ChainNetwork) -> int:
    return int(call(network, "eth_gasPrice"), 16)


def chain_id(network: ChainNetwork) -> int:
    return int(call(network, "eth_chainId"), 16)


def eth_call(network: ChainNetwork, to: str, data: str, block: str = "latest") -> str:
    """A read-only contract call's return data (0x-hex); a revert is ChainRejected."""
    return str(call(network, "eth_call", [{"to": Web3.to_checksum_address(to), "data": _hex(data)}, block]))


def get_logs(network: ChainNetwork, *, address: str, topics: list[Any], from_block: int = 0,
             to_block: int | str = "latest") -> list[dict]:
    query = {"address": Web3.to_checksum_address(address), "topics": topics, "fromBlock": hex(from_block),
             "toBlock": hex(to_block) if isinstance(to_block, int) else to_block}
    return normalize(call(network, "eth_getLogs", [query]))
