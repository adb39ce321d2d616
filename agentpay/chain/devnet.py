"""The demo's local chain (bin/demo, issue 18): deploy the token from the committed artifact on a
freshly started anvil, mint to a demo payer, and create or update the ChainNetwork row pointing
at it. `devnet_setup(rpc_url)` returns the AGENTPAY_CHAIN_KEYS mapping; bin/demo calls `main` through
`manage.py shell -c` and exports the JSON it prints as its last line.

The keys are anvil's well-known development accounts (its default mnemonic): public, funded on a
local anvil only, never on a real network. Nothing here runs in the product's request path.
"""

from __future__ import annotations

import json
import sys
import time

from eth_account import Account
from eth_utils import to_checksum_address

from agentpay.chain import rpc, token
from agentpay.models.chain import ChainNetwork

# anvil's default accounts 0-3 ("test test ... junk"): deployer, submitter, pay_to, demo payer.
DEV_KEYS = (
    "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80",
    "0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d",
    "0x5de4111afa1a4b94908f83103eb1f1706367c2e68ca870fc3fb9a804cdab365a",
    "0x7c852118294e51e653712a81e05800f419141751be58f605c371e15141b007a6",
)
DEMO_PAYER_UNITS = 1_000 * 10**6


def _send(network, key: str, *, to: str | None, data: str) -> dict:
    sender = Account.from_key(key).address
    tx = {"nonce": rpc.transaction_count(network, sender), "gas": 5_000_000, "chainId": rpc.chain_id(network),
          "maxFeePerGas": rpc.gas_price(network) * 2, "maxPriorityFeePerGas": 10**9, "value": 0, "data": data}
    if to is not None:
        tx["to"] = to
    tx_hash = rpc.send_raw_transaction(network, "0x" + Account.sign_transaction(tx, key).raw_transaction.hex())
    for _ in range(200):
        receipt = rpc.get_receipt(network, tx_hash)
        if receipt is not None:
            if receipt["status"] != 1:
                raise RuntimeError(f"demo chain transaction {tx_hash} reverted")
            return receipt
        time.sleep(0.05)
    raise RuntimeError(f"demo chain transaction {tx_hash} was not mined")


def devnet_setup(rpc_url: str) -> dict[str, str]:
    """Deploy + mint + the ChainNetwork row; returns AGENTPAY_CHAIN_KEYS (submitter, pay_to)."""
    deployer, submitter, pay_to, payer = DEV_KEYS
    probe = ChainNetwork(rpc_url=rpc_url, rpc_timeout_seconds=5.0)
    chain_id = rpc.chain_id(probe)
    deployed = _send(probe, deployer, to=None, data=token.bytecode())
    address = deployed["contractAddress"].lower()
    payer_address = Account.from_key(payer).address.lower()
    _send(probe, deployer, to=to_checksum_address(address),
          data=token.mint_calldata(payer_address, DEMO_PAYER_UNITS))
    ChainNetwork.objects.update_or_create(caip2=f"eip155:{chain_id}", defaults={
        "name": "local anvil (demo)", "chain_id": chain_id, "rpc_url": rpc_url, "confirmations": 1,
        "token_address": address, "token_name": "USD Coin", "token_version": "2", "token_decimals": 6,
        "pay_to": Account.from_key(pay_to).address.lower(), "submitter": Account.from_key(submitter).address.lower(),
        "active": True})
    print(f"demo chain: token {address} on eip155:{chain_id} at {rpc_url}; "
          f"payer {payer_address} (key {payer}) holds {DEMO_PAYER_UNITS} units", file=sys.stderr)
    return {Account.from_key(k).address.lower(): k for k in (submitter, pay_to)}


def main(argv: list[str]) -> int:
    """Needs Django set up first (bin/demo calls it through `manage.py shell -c`)."""
    print(json.dumps(devnet_setup(argv[0] if argv else "http://127.0.0.1:8545")))
    return 0
