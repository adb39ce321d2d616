"""The acceptance point and the ledger refuse what the seed forbids, and record the refusal."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction

from agentpay.composite import UnreachablePair, display_status
from agentpay.models import IntentReceipt, PaymentIntent, Transfer
from agentpay.services.acceptance import intent_accept_event
from agentpay.services.ledger import LedgerRefusal, ledger_capture, ledger_release
from agentpay.states import INITIAL, TRANSITIONS, Lines, events_of, step_verdict

pytestmark = pytest.mark.django_db


def completed(call) -> PaymentIntent:
    return PaymentIntent.objects.get(intent_id=call("ok")["AgentPay-Intent"])


def test_terminal_states_refuse_every_event_and_say_so(funded, routes, call):
    intent = completed(call)
    before = intent.generation
    for line in TRANSITIONS:
        for event in events_of(line):
            outcome = intent_accept_event(intent.intent_id, line, event)
            assert not outcome.accepted and outcome.refusal_code == "TERMINAL_STATE"
    intent.refresh_from_db()
    assert intent.generation == before and intent.state == "completed"
    assert IntentReceipt.objects.filter(intent=intent, accepted=False, refusal_code="TERMINAL_STATE").count() == sum(
        len(events_of(line)) for line in TRANSITIONS)


def test_a_stale_generation_is_refused(funded, routes, call):
    intent = PaymentIntent.objects.get(intent_id=call("boom")["AgentPay-Intent"])
    outcome = intent_accept_event(intent.intent_id, "fulfillment", "upstream_status_query_ok",
                                  expect_generation=intent.generation - 1)
    assert outcome.refusal_code == "STALE_GENERATION"


def test_no_capture_or_release_while_fulfillment_is_unknown(funded, routes, call):
    intent = PaymentIntent.objects.get(intent_id=call("boom")["AgentPay-Intent"])
    assert intent_accept_event(intent.intent_id, "settlement", "capture").refusal_code == "NO_UPSTREAM_SUCCESS"
    assert intent_accept_event(intent.intent_id, "settlement", "release").refusal_code == "FULFILLMENT_NOT_FAILED"


def test_no_fallback_to_the_chain(funded, routes, call):
    intent = PaymentIntent.objects.get(intent_id=call("pricey")["AgentPay-Intent"])
    assert intent.state == "failed"
    fresh = Lines("wallet", "authorized", "not_started", "not_started")
    assert step_verdict(fresh, "settlement", "submit_ok").code == "RAIL_MISMATCH"
    assert step_verdict(fresh, "fulfillment", "dispatch").code == "NOT_SETTLED_FOR_DISPATCH"


def test_a_hold_resolves_once(funded, routes, call):
    intent = completed(call)
    hold = intent.settlements.get().hold
    with transaction.atomic():
        with pytest.raises(LedgerRefusal, match="HOLD_ALREADY_RESOLVED"):
            ledger_capture(hold=hold, actor="test", now=intent.created_at)
        with pytest.raises(LedgerRefusal, match="HOLD_ALREADY_RESOLVED"):
            ledger_release(hold=hold, actor="test", now=intent.created_at)
    # Even past the service, the database refuses a second resolution.
    with pytest.raises(IntegrityError), transaction.atomic():
        Transfer.objects.create(transfer_id="xfr_twice", kind="void_pending", debit_account_id=hold.debit_account_id,
                                credit_account_id=hold.credit_account_id, amount=hold.amount, currency="usd",
                                pending=hold, actor="test", created_at=intent.created_at)


def test_transfers_cannot_be_rewritten_even_in_sql(funded, routes, call):
    completed(call)
    with pytest.raises(Exception, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE agentpay_transfer SET amount = 1")


def test_a_wallet_cannot_go_below_zero_in_the_database(funded):
    from agentpay.models import LedgerAccount

    with pytest.raises(IntegrityError), transaction.atomic():
        LedgerAccount.objects.filter(tenant=funded).update(debits_pending=5000)


def _reachable() -> set[Lines]:
    """Every (intent, settlement, fulfillment) a sequence of allowed steps reaches, both rails."""
    seen: set[Lines] = set()
    todo = [Lines(rail, INITIAL["intent"], INITIAL["settlement"], INITIAL["fulfillment"]) for rail in
            ("wallet", "onchain")]
    while todo:
        lines = todo.pop()
        if lines in seen:
            continue
        seen.add(lines)
        for line, table in TRANSITIONS.items():
            for (state, event), to in table.items():
                if state != lines.state(line):
                    continue
                for manual in (False, True):
                    if step_verdict(lines, line, event, manual=manual).allowed:
                        todo.append(lines.moved(line, to))
    return seen


def test_the_composite_view_names_every_reachable_combination():
    reachable = _reachable()
    assert len(reachable) > 20
    statuses = {lines: display_status(lines) for lines in reachable}  # raises UnreachablePair if one is missing
    assert statuses[Lines("wallet", "authorized", "held", "unknown")] == "WALLET_HOLD_NEEDS_REVIEW"
    assert statuses[Lines("wallet", "failed", "failed", "not_started")] == "PAYMENT_FAILED"
    assert statuses[Lines("wallet", "created", "not_started", "not_started")] == "AWAITING_AUTHORIZATION"
    assert statuses[Lines("wallet", "failed", "released", "failed")] == "RELEASED_UNBILLED"
    with pytest.raises(UnreachablePair):
        display_status(Lines("wallet", "completed", "released", "succeeded"))
