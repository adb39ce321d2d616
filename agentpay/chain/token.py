"""The EIP-3009 token's calls, from the committed artifact's ABI (agentpay/chain/artifacts/).

Calldata is encoded here without a node (selector + eth_abi), so signing a transaction needs no
network call; reads go through agentpay.chain.rpc and raise its ChainTimeout / ChainRejected.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from eth_abi import decode, encode
from eth_utils import keccak, to_checksum_address

from agentpay.chain import rpc
from agentpay.models.chain import ChainNetwork

ARTIFACT = Path(__file__).resolve().parent / "artifacts" / "EIP3009Token.json"

TRANSFER_WITH_AUTHORIZATION_BYTES = "transferWithAuthorization(address,address,uint256,uint256,uint256,bytes32,bytes)"
TRANSFER_WITH_AUTHORIZATION_VRS = (
    "transferWithAuthorization(address,address,uint256,uint256,uint256,bytes32,uint8,bytes32,bytes32)")
TRANSFER = "transfer(address,uint256)"
MINT = "mint(address,uint256)"
AUTHORIZATION_USED_TOPIC = "0x" + keccak(text="AuthorizationUsed(address,bytes32)").hex()
AUTHORIZATION_CANCELED_TOPIC = "0x" + keccak(text="AuthorizationCanceled(address,bytes32)").hex()
TRANSFER_TOPIC = "0x" + keccak(text="Transfer(address,address,uint256)").hex()


@cache
def artifact() -> dict[str, Any]:
    return json.loads(ARTIFACT.read_text())


def abi() -> list[dict[str, Any]]:
    return artifact()["abi"]


def bytecode() -> str:
    return artifact()["bytecode"]


def selector(signature: str) -> bytes:
    return keccak(text=signature)[:4]


def _calldata(signature: str, values: list[Any]) -> str:
    types = signature[signature.index("(") + 1:-1].split(",")
    return "0x" + (selector(signature) + encode(types, values)).hex()


def _bytes(value: str | bytes, length: int | None = None) -> bytes:
    out = bytes(value) if isinstance(value, bytes | bytearray) else bytes.fromhex(value.removeprefix("0x"))
    if length is not None and len(out) != length:
        raise ValueError(f"expected {length} bytes, got {len(out)}")
    return out


def _topic_address(address: str) -> str:
    return "0x" + "00" * 12 + address.lower().removeprefix("0x")


def transfer_with_authorization_calldata(auth: dict[str, Any]) -> str:
    """Calldata of the `bytes signature` overload: auth has from, to, value, validAfter,
    validBefore, nonce (32-byte hex) and signature (65-byte hex r‖s‖v)."""
    return _calldata(TRANSFER_WITH_AUTHORIZATION_BYTES, [
        to_checksum_address(auth["from"]), to_checksum_address(auth["to"]), int(auth["value"]),
        int(auth["validAfter"]), int(auth["validBefore"]), _bytes(auth["nonce"], 32),
        _bytes(auth["signature"], 65)])


def transfer_calldata(to: str, value: int) -> str:
    return _calldata(TRANSFER, [to_checksum_address(to), int(value)])


def mint_calldata(to: str, value: int) -> str:
    return _calldata(MINT, [to_checksum_address(to), int(value)])


def _read(network: ChainNetwork, signature: str, values: list[Any], out: list[str], block: str = "latest") -> Any:
    data = rpc.eth_call(network, network.token_address, _calldata(signature, values), block)
    return decode(out, _bytes(data))[0]


def authorization_state(network: ChainNetwork, payer: str, nonce: str) -> bool:
    """True when (payer, nonce) was used or canceled on chain (at the latest block)."""
    return bool(_read(network, "authorizationState(address,bytes32)",
                      [to_checksum_address(payer), _bytes(nonce, 32)], ["bool"]))


def balance_of(network: ChainNetwork, address: str) -> int:
    return int(_read(network, "balanceOf(address)", [to_checksum_address(address)], ["uint256"]))


def authorization_used_logs(network: ChainNetwork, payer: str, nonce: str, from_block: int = 0) -> list[dict]:
    """The AuthorizationUsed events for (payer, nonce) on the canonical chain: each with
    transactionHash, blockNumber, blockHash (lowercase hex), logIndex. At most one can exist."""
    nonce_topic = "0x" + _bytes(nonce, 32).hex()
    logs = rpc.get_logs(network, address=network.token_address,
                        topics=[AUTHORIZATION_USED_TOPIC, _topic_address(payer), nonce_topic], from_block=from_block)
    return [{"transactionHash": str(log["transactionHash"]).lower(), "blockNumber": log["blockNumber"],
             "blockHash": str(log["blockHash"]).lower(), "logIndex": log.get("logIndex")}
            for log in logs if not log.get("removed")]
