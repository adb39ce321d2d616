"""The on-chain settlement tests run on the real local chain (anvil; chain's fixture in
tests/support/chain.py) against the loopback upstream, with AgentPay's actors and the ledger
auditor of tests/agentpay."""

from __future__ import annotations

from tests.agentpay.conftest import audited_ledger, lead, upstream  # noqa: F401  (fixtures)
from tests.support.chain import chain, chain_node  # noqa: F401  (fixtures)
