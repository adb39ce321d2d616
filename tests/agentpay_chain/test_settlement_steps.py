"""Which steps a round of chain evidence proves, from each live state (no chain needed): every
step is a row of the seed's §4.2 table, applied in order, and no evidence ever skips `unknown`
for a failure without a receipt."""

from __future__ import annotations

import pytest

from agentpay.chain.settlement import steps_for
from agentpay.chain.transactions import Evidence
from agentpay.states import SETTLEMENT_TRANSITIONS

KINDS = [Evidence("confirmed", "d"), Evidence("seen", "d"), Evidence("failed", "d", reverted=True),
         Evidence("failed", "d"), Evidence("timeout", "d"), Evidence("dropped", "d"), Evidence("review", "d")]


@pytest.mark.parametrize("state", ["submitted", "pending", "unknown"])
@pytest.mark.parametrize("evidence", KINDS, ids=lambda e: f"{e.kind}{'-reverted' if e.reverted else ''}")
def test_every_proven_step_is_a_row_of_the_table(state, evidence):
    found = steps_for(state, evidence)
    current = state
    for event, _ in found.steps:
        assert (current, event) in SETTLEMENT_TRANSITIONS, (current, event)
        current = SETTLEMENT_TRANSITIONS[(current, event)]
    expected = {"confirmed": "confirmed", "failed": "failed"}.get(evidence.kind)
    if expected:
        assert current == expected
    elif evidence.kind == "seen":
        assert current == "pending"
    elif evidence.kind == "timeout":
        assert current == "unknown"
    else:
        assert current == state  # dropped (rebroadcast) or review: the line stays
    assert found.rebroadcast == (evidence.kind == "dropped")


def test_a_failure_without_our_receipt_is_never_a_revert():
    # Expired or canceled unused: the table's `reverted` is for our own receipt with status 0.
    for state in ("submitted", "pending"):
        events = [e for e, _ in steps_for(state, Evidence("failed", "expired")).steps]
        assert events == ["query_timeout", "query_found_failed"]
