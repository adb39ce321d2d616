"""The seeded on-chain simulation (issue 18): agents paying with x402 on the real test chain
while mining pauses, answers are lost after the node acted and pending transactions vanish; the
auditor judges the database against the chain after every step (tests/verification/
agentpay_sim/onchain.py). Seeds: AGENTPAY_CHAIN_SIM_SEEDS ("1-2"), steps AGENTPAY_CHAIN_SIM_STEPS.
The broken-world tests make one violation the product cannot make and prove the auditor names it."""

from __future__ import annotations

import os

import pytest
from django.db import connection

from agentpay.chain.token import transfer_calldata
from tests.verification.agentpay_sim.onchain import OnchainSimulation, Step, generate

SEEDS = os.environ.get("AGENTPAY_CHAIN_SIM_SEEDS", "1-2")
STEPS = int(os.environ.get("AGENTPAY_CHAIN_SIM_STEPS", "40"))


def _seeds() -> list[int]:
    if "-" in SEEDS:
        low, high = SEEDS.split("-")
        return list(range(int(low), int(high) + 1))
    return [int(s) for s in SEEDS.split(",") if s.strip()]


@pytest.mark.race
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("seed", _seeds())
def test_onchain_seed_has_no_invariant_violation(seed, chain):
    result = OnchainSimulation(seed, generate(seed, STEPS), chain=chain).run()
    print(f"\nonchain seed {seed}: " + ", ".join(f"{k} {v}" for k, v in sorted(result.counters.items())))
    assert result.ok, "\n".join(map(str, result.violations[:20]))
    assert result.counters["http:200"] > 0, "no paid call completed: the run proved nothing"


PAID = [Step("pay", a=0, what="ok"), Step("pay", a=0, what="bad")]


@pytest.mark.django_db(transaction=True)
def test_the_auditor_sees_money_moved_that_no_authorization_explains(chain):
    sim = OnchainSimulation(0, PAID, chain=chain)
    original = sim.check

    def check_after_a_stray_transfer() -> None:
        if sim.step_no == 1:  # a payer's tokens leave by a transfer the product knows nothing of
            payer = chain.payers[0]
            chain.wait_receipt(chain.send(payer, to=chain.token_address,
                                          data=transfer_calldata(chain.pay_to.address, 7)))
        original()

    sim.check = check_after_a_stray_transfer
    result = sim.run()
    assert {v.code for v in result.violations} == {"PAYER_BALANCE_MISMATCH"}, result.violations


@pytest.mark.django_db(transaction=True)
def test_the_auditor_sees_a_confirmation_the_chain_never_saw(chain):
    sim = OnchainSimulation(0, [Step("pay", a=0, what="ok")], chain=chain)
    original = sim.check

    def check_after_a_forged_confirmation() -> None:
        if sim.step_no == 0:
            with connection.cursor() as cursor:  # as a bug would: the evidence no longer the chain's
                cursor.execute("ALTER TABLE agentpay_chainauthorization DISABLE TRIGGER USER")
                cursor.execute("UPDATE agentpay_chainauthorization SET nonce = %s", ["0x" + "ab" * 32])
                cursor.execute("ALTER TABLE agentpay_chainauthorization ENABLE TRIGGER USER")
        original()

    sim.check = check_after_a_forged_confirmation
    result = sim.run()
    assert "CONFIRMED_NOT_ON_CHAIN" in {v.code for v in result.violations}, result.violations
