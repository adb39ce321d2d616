"""A test buyer: an agent that answers a 402 the way x402 clients do.

`pay` uses the official SDK client (x402ClientSync + the exact EVM scheme + EthAccountSigner);
`sign` builds the PAYMENT-SIGNATURE by hand with eth_account's EIP-712 signing, so a test can
bend one field (the amount, the window, the domain, the signer) and nothing else.
"""

from __future__ import annotations

import base64
import json
import os
import time
from typing import Any

from eth_account import Account
from eth_account.signers.local import LocalAccount
from x402 import x402ClientSync
from x402.http.utils import encode_payment_signature_header
from x402.mechanisms.evm.exact import register_exact_evm_client
from x402.mechanisms.evm.signers import EthAccountSigner

from agentpay.x402.headers import decode_payment_required

TYPES = {"TransferWithAuthorization": [
    {"name": "from", "type": "address"}, {"name": "to", "type": "address"}, {"name": "value", "type": "uint256"},
    {"name": "validAfter", "type": "uint256"}, {"name": "validBefore", "type": "uint256"},
    {"name": "nonce", "type": "bytes32"}]}


class Buyer:
    def __init__(self, account: LocalAccount | None = None) -> None:
        self.account = account or Account.create()
        self.address = self.account.address

    def pay(self, payment_required: str) -> str:
        """The SDK client's PAYMENT-SIGNATURE for a PAYMENT-REQUIRED header."""
        required = decode_payment_required(payment_required)
        client = register_exact_evm_client(x402ClientSync(), EthAccountSigner(self.account))
        # Our test token is not one of the SDK's default assets: the buyer opts in to it, capped at
        # the price it was told (a buyer's own spend control, as the SDK asks).
        terms = required.accepts[0]
        client.set_spend_controls({"allowed_assets": [{"network": terms.network, "asset": terms.asset,
                                                       "max_amount_per_payment": terms.amount}]})
        payload = client.create_payment_payload(required)
        return encode_payment_signature_header(payload)

    def sign(self, payment_required: str, *, signer: LocalAccount | None = None, domain: dict[str, Any] | None = None,
             accepted: dict[str, Any] | None = None, version: Any = 2, **authorization: Any) -> str:
        """A hand-made PAYMENT-SIGNATURE: the challenge's terms, with any field overridden."""
        required = json.loads(base64.b64decode(payment_required))
        terms = dict(required["accepts"][0])
        auth = {"from": self.address, "to": terms["payTo"], "value": terms["amount"], "validAfter": "0",
                "validBefore": str(int(time.time()) + terms["maxTimeoutSeconds"]), "nonce": "0x" + os.urandom(32).hex()}
        auth.update({k.replace("valid_after", "validAfter").replace("valid_before", "validBefore"): v
                     for k, v in authorization.items()})
        chain_id = int(terms["network"].split(":")[1])
        dom = {"name": terms["extra"]["name"], "version": terms["extra"]["version"], "chainId": chain_id,
               "verifyingContract": terms["asset"], **(domain or {})}
        message = {**auth, "value": int(auth["value"]), "validAfter": int(auth["validAfter"]),
                   "validBefore": int(auth["validBefore"]), "nonce": bytes.fromhex(auth["nonce"][2:])}
        signed = (signer or self.account).sign_typed_data(dom, TYPES, message)
        doc = {"x402Version": version, "accepted": {**terms, **(accepted or {})}, "resource": required["resource"],
               "payload": {"signature": "0x" + bytes(signed.signature).hex(), "authorization": auth}}
        return encode(doc)


def encode(doc: Any) -> str:
    return base64.b64encode(json.dumps(doc).encode()).decode()


def decode(header: str) -> dict[str, Any]:
    return json.loads(base64.b64decode(header))
