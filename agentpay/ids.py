"""Prefixed identifiers of seed 004 §2 (`pi_…`, `stl_…`, `ful_…`, `hld_…`), the on-chain
rail's (`chl_…` challenge, `ctx_…` transaction, `rfd_…` refund) and API keys (`ak_…`).

Random, not sequential: an id in a URL or an upstream's idempotency key must not let one tenant
guess another's.
"""

from __future__ import annotations

import secrets

INTENT = "pi_"
SETTLEMENT = "stl_"
FULFILLMENT = "ful_"
HOLD = "hld_"
TRANSFER = "xfr_"
ACCOUNT = "acc_"
TENANT = "tnt_"
API_KEY = "ak_"
CHALLENGE = "chl_"
CHAIN_TX = "ctx_"
REFUND = "rfd_"


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


def new_api_key() -> str:
    return API_KEY + secrets.token_urlsafe(32)


# Named defaults for model fields (migrations can serialise a module function, not a lambda).
def new_tenant_id() -> str:
    return new_id(TENANT)


def new_intent_id() -> str:
    return new_id(INTENT)


def new_settlement_id() -> str:
    return new_id(SETTLEMENT)


def new_fulfillment_id() -> str:
    return new_id(FULFILLMENT)


def new_account_id() -> str:
    return new_id(ACCOUNT)


def new_challenge_id() -> str:
    return new_id(CHALLENGE)


def new_chain_tx_id() -> str:
    return new_id(CHAIN_TX)


def new_refund_id() -> str:
    return new_id(REFUND)
