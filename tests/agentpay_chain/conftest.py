"""The on-chain settlement tests run on the real local chain (anvil: `chain`, from
tests/support/chain.py, registered in tests/conftest.py) against the loopback upstream, with
AgentPay's actors and the ledger auditor of tests/agentpay."""

from __future__ import annotations

from tests.agentpay.conftest import audited_ledger, lead, upstream  # noqa: F401  (fixtures)
