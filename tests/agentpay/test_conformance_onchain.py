"""The on-chain conformance vectors through the real acceptance service (issue 18): every
on-chain vector and negative of state-machine.json, event by event, on PostgreSQL, with the
evidence each event needs made real against the test chain (conformance_onchain); and every
(state, event) pair the tables do not list refused in every reachable on-chain configuration.

The HTTP answers the vectors name are the gateway's; tests/agentpay_x402 drives the gateway on
the real chain (402 with PAYMENT-REQUIRED, 200 with PAYMENT-RESPONSE, 202 while unknown, 402 on
a failed settlement).
"""

from __future__ import annotations

import pytest

from agentpay.composite import PAIRS
from agentpay.models import IntentReceipt, RefundObligation
from agentpay.selectors import intent_display_status
from agentpay.states import ROWS, TRANSITIONS, events_of
from tests.agentpay import conformance_onchain as co
from tests.agentpay import conformance_world as cw
from tests.support.actors import AGENTS, make_user, role

pytestmark = pytest.mark.django_db


@pytest.fixture
def actors(lead) -> cw.Actors:
    agent = make_user("agent", password=None, staff=True)
    agent.groups.add(role(AGENTS))
    return cw.Actors(lead=lead, agent=agent)


@pytest.mark.parametrize("vector", cw.ONCHAIN_VECTORS, ids=lambda v: v["id"])
def test_onchain_vector_through_the_acceptance_service(vector, actors, upstream, chain):
    world = co.OnchainWorld(vector, actors, cw.Clock(), chain=chain, base_url=upstream.base_url)
    intent = world.intent
    assert cw.lines_now(intent) == {k: vector["given"][k] for k in ("intent", "settlement", "fulfillment")}
    for n, e in enumerate(vector["events"]):
        if e["line"] == "gateway":
            continue
        before = intent.generation
        receipts = IntentReceipt.objects.filter(intent=intent).count()
        outcome = world.send(cw.LINE[e["line"]], e["event"], e.get("data", {}), expected=e["result"] == "accepted")
        where = f"{vector['id']} event {n} {e['line']}.{e['event']}: {outcome.refusal_code} {outcome.detail}"
        assert outcome.accepted == (e["result"] == "accepted"), where
        assert IntentReceipt.objects.filter(intent=intent).count() == receipts + 1, where
        intent.refresh_from_db()
        if not outcome.accepted:
            assert intent.generation == before, where
            assert outcome.refusal == e["refusal"], where
            if "guard" in e:
                assert outcome.guard == e["guard"], where
    expect = vector["expect"]
    assert cw.lines_now(intent) == {k: expect[k] for k in ("intent", "settlement", "fulfillment")}, vector["id"]
    assert intent_display_status(intent) == expect["display_status"], vector["id"]
    refund_owed = expect["display_status"] in ("SETTLED_FULFILLMENT_FAILED_REFUND_REQUIRED",
                                               "SETTLED_NOT_FULFILLED_REFUND_REQUIRED")
    # Paid on chain, not delivered: the refund obligation exists (C08); never without it.
    assert RefundObligation.objects.filter(intent=intent).exists() == refund_owed, vector["id"]


ONCHAIN_CONFIGS = sorted({(i, s, f) for (rail, s, f), entries in PAIRS.items() if rail == "onchain"
                          for intents, _ in entries for i in intents})


@pytest.mark.parametrize(("intent_state", "settlement", "fulfillment"), ONCHAIN_CONFIGS,
                         ids=["/".join(c) for c in ONCHAIN_CONFIGS])
def test_every_unlisted_onchain_pair_is_refused(intent_state, settlement, fulfillment, actors, upstream, chain):
    given = {"intent": intent_state, "settlement": settlement, "fulfillment": fulfillment}
    vector = {"id": "GRID", "rail": "onchain", "given": given, "events": [], "expect": {}}
    world = co.OnchainWorld(vector, actors, cw.Clock(), chain=chain, base_url=upstream.base_url)
    assert cw.lines_now(world.intent) == given
    tried = 0
    for line in TRANSITIONS:
        for event in events_of(line):
            row = ROWS.get((line, given[line], event))
            if row is not None and "onchain" in row[1]:
                continue
            outcome = world.send(line, event, expected=False)
            assert not outcome.accepted, (line, given[line], event)
            assert outcome.refusal in ("terminal_state", "rail_mismatch", "no_transition"), (
                line, given[line], event, outcome.refusal_code)
            tried += 1
    assert tried > 0
    assert cw.lines_now(world.intent) == given
