"""A paid call's round trips (bench/last_run/agentpay.md): the acceptance's lock read is one
statement, and authorize → hold is one acceptance. Shapes of SQL and the invariants
of the folded transaction, never timings."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from agentpay.bridge import ApiAccess, trusted_now
from agentpay.models import IntentReceipt, LedgerAccount, OutboxMessage, PaymentIntent, Transfer
from agentpay.selectors import intent_display_status
from agentpay.services import wallet_flow
from agentpay.services.acceptance import intent_accept
from agentpay.services.intents import intent_open
from agentpay.services.locking import lock_intent
from agentpay.services.results import Cause, Step
from agentpay.services.wallet_flow import intent_drive_wallet

pytestmark = pytest.mark.django_db


def _open(tenant, route, key: str = "k") -> PaymentIntent:
    return intent_open(tenant=tenant, route=route, rail="wallet", idempotency_key=key, digest="d", forward_path="",
                       forward_query="", content_type="", body=b"", request_id=uuid.uuid4(), now=trusted_now()).intent


def _drive(intent: PaymentIntent, *, just_opened: bool = True):
    request_id = uuid.uuid4()
    return intent_drive_wallet(intent=intent, cause=Cause.request(request_id, intent.tenant.tenant_id),
                               access=ApiAccess(True), request_id=request_id, just_opened=just_opened)


def _accepted(intent: PaymentIntent) -> list[tuple[int, str]]:
    return list(IntentReceipt.objects.filter(intent=intent, accepted=True).order_by("pk")
                .values_list("generation", "event"))


def _open_paid(tenant, route, key: str = "k"):
    """An open as the gateway asks it: authorize, hold and dispatch on open (open_steps)."""
    return intent_open(tenant=tenant, route=route, rail="wallet", idempotency_key=key, digest="d", forward_path="",
                       forward_query="", content_type="", body=b"", request_id=uuid.uuid4(), now=trusted_now(),
                       steps=wallet_flow.open_steps(route.price_minor))


def _drive_opened(opened):
    request_id = uuid.uuid4()
    return intent_drive_wallet(intent=opened.intent, cause=Cause.request(request_id, opened.intent.tenant.tenant_id),
                               access=ApiAccess(True), request_id=request_id, just_opened=opened.created,
                               opened_lines=opened.lines, release_lease=True)


def test_a_gateway_paid_call_is_two_generations_the_open_with_its_dispatch_then_the_answer(funded, routes,
                                                                                          monkeypatch):
    seen = {}
    forward = wallet_flow.upstream_forward

    def spy(**kwargs):  # what is committed when the upstream is called
        intent = PaymentIntent.objects.get(intent_id=seen["intent"])
        seen["lines"] = (intent.state, intent.settlements.get().state, intent.fulfillment.state)
        seen["dispatched"] = intent.fulfillment.dispatched_at is not None
        seen["calls"] = seen.get("calls", 0) + 1
        return forward(**kwargs)

    monkeypatch.setattr(wallet_flow, "upstream_forward", spy)
    opened = _open_paid(funded, routes["ok"])
    seen["intent"] = opened.intent.intent_id
    assert (opened.lines.intent, opened.lines.settlement, opened.lines.fulfillment) == wallet_flow.DISPATCHED_ON_OPEN
    driven = _drive_opened(opened)
    assert driven.outcome.accepted and driven.outcome.lines.intent == "completed" and driven.lease_released
    assert seen == {"intent": opened.intent.intent_id, "lines": ("authorized", "held", "in_progress"),
                    "dispatched": True, "calls": 1}
    assert _accepted(opened.intent) == [(0, "opened"), (1, "payload_verified"), (1, "hold_acquired"),
                                        (1, "dispatch"), (2, "upstream_2xx"), (2, "capture"),
                                        (2, "settlement_confirmed")]
    assert [m.payload["events"] for m in OutboxMessage.objects.filter(intent=opened.intent).order_by("pk")] == [
        ["intent.payload_verified", "settlement.hold_acquired", "fulfillment.dispatch"],
        ["fulfillment.upstream_2xx", "settlement.capture", "intent.settlement_confirmed"]]
    wallet = LedgerAccount.objects.get(kind="wallet", tenant=funded)
    assert (wallet.debits_posted, wallet.debits_pending, wallet.available) == (150, 0, 850)


def test_a_dispatched_intent_that_is_not_this_requests_open_is_never_sent_again(funded, routes, monkeypatch):
    opened = _open_paid(funded, routes["ok"])
    monkeypatch.setattr(wallet_flow, "upstream_forward", lambda **_: pytest.fail("sent again"))
    driven = _drive(PaymentIntent.objects.get(pk=opened.intent.pk), just_opened=False)  # a resumed request
    assert driven.answer is None and driven.outcome is None
    assert PaymentIntent.objects.get(pk=opened.intent.pk).fulfillment.state == "in_progress"


def test_a_gateway_paid_call_stays_within_its_statements(funded, routes, django_assert_max_num_queries):
    _drive_opened(_open_paid(funded, routes["ok"], key="warm"))  # the revenue shard's id is cached
    # The open: savepoint, insert + wallet lock, hold, the rows, release (5); the answer: savepoint,
    # lock, capture, writes, release (5). It was 14 with dispatch an acceptance of its own.
    with django_assert_max_num_queries(10):
        assert _drive_opened(_open_paid(funded, routes["ok"])).outcome.lines.intent == "completed"


def test_a_paid_call_is_three_acceptances_authorize_and_hold_dispatch_the_answer(funded, routes):
    intent = _open(funded, routes["ok"])
    driven = _drive(intent)
    assert driven.outcome.accepted and driven.outcome.lines.intent == "completed"
    assert _accepted(intent) == [(0, "opened"), (1, "payload_verified"), (1, "hold_acquired"), (2, "dispatch"),
                                 (3, "upstream_2xx"), (3, "capture"), (3, "settlement_confirmed")]
    assert OutboxMessage.objects.filter(intent=intent).count() == 3
    assert [m.payload["events"] for m in OutboxMessage.objects.filter(intent=intent).order_by("pk")] == [
        ["intent.payload_verified", "settlement.hold_acquired"], ["fulfillment.dispatch"],
        ["fulfillment.upstream_2xx", "settlement.capture", "intent.settlement_confirmed"]]
    hold = Transfer.objects.get(intent=intent, kind="pending")
    assert Transfer.objects.get(intent=intent, pending=hold).kind == "post_pending"
    wallet = LedgerAccount.objects.get(kind="wallet", tenant=funded)
    assert (wallet.debits_posted, wallet.debits_pending, wallet.available) == (150, 0, 850)


def test_the_dispatch_is_accepted_after_its_hold_before_the_upstream_is_called(funded, routes, monkeypatch):
    seen = {}

    def forward(**kwargs):  # what is written when the upstream is called
        intent = PaymentIntent.objects.get(intent_id=seen["intent"])
        seen["lines"] = (intent.state, intent.settlements.get().state, intent.fulfillment.state)
        seen["hold"] = Transfer.objects.filter(intent=intent, kind="pending").count()
        raise ConnectionError("upstream unreachable")

    monkeypatch.setattr(wallet_flow, "upstream_forward", forward)
    intent = _open(funded, routes["ok"])
    seen["intent"] = intent.intent_id
    with pytest.raises(ConnectionError):
        _drive(intent)
    assert seen == {"intent": intent.intent_id, "lines": ("authorized", "held", "in_progress"), "hold": 1}


def test_too_little_balance_is_one_refused_acceptance_then_authorize_and_fail_together(funded, routes):
    intent = _open(funded, routes["pricey"])  # 5,000 against 1,000
    driven = _drive(intent)
    assert driven.refusal == "INSUFFICIENT_BALANCE"
    assert driven.outcome.accepted and driven.outcome.lines.intent == "failed"
    assert driven.outcome.lines.settlement == "failed" and driven.outcome.lines.fulfillment == "not_started"
    refused = IntentReceipt.objects.get(intent=intent, accepted=False)
    assert (refused.event, refused.refusal_code) == ("hold_acquired", "INSUFFICIENT_BALANCE")
    assert "payload_verified" in refused.detail  # rolled back with it
    assert _accepted(intent) == [(0, "opened"), (1, "payload_verified"), (1, "hold_failed"),
                                 (1, "settlement_failed")]
    assert not Transfer.objects.filter(intent=intent).exists()
    assert not IntentReceipt.objects.filter(intent=intent, event="dispatch", accepted=True).exists()


def test_a_resumed_intent_takes_what_is_left_in_one_acceptance(funded, routes):
    intent = _open(funded, routes["ok"])
    cause = Cause.system("test")
    assert intent_accept(intent_id=intent.intent_id, steps=[Step("intent", "payload_verified")], cause=cause).accepted
    driven = _drive(PaymentIntent.objects.get(pk=intent.pk), just_opened=False)
    assert driven.outcome.lines.intent == "completed"
    assert _accepted(intent)[2:] == [(2, "hold_acquired"), (3, "dispatch"), (4, "upstream_2xx"), (4, "capture"),
                                     (4, "settlement_confirmed")]


def test_the_drive_of_a_fresh_intent_stays_within_its_statements(funded, routes, django_assert_max_num_queries):
    _drive(_open(funded, routes["ok"], key="warm"))  # the revenue shard exists and its id is cached
    intent = _open(funded, routes["ok"])
    # The policy read (1); the first acceptance's savepoint, lock, hold, writes, release (5);
    # dispatch's savepoint, lock, writes, release (4); the answer's, with the capture (5). It was
    # 55 with four acceptances, 31 before the hold, the capture and each acceptance's writes were
    # one statement each (ledger_writes, accept_writes).
    with django_assert_max_num_queries(15):
        assert _drive(intent).outcome.lines.intent == "completed"


@pytest.mark.parametrize("wallet", [False, True])
def test_the_lock_read_is_one_statement_and_loads_the_rows(funded, routes, wallet):
    intent = _open(funded, routes["ok"])
    assert intent_accept(intent_id=intent.intent_id, steps=[Step("intent", "payload_verified"),
                                                             Step("settlement", "hold_acquired")],
                         cause=Cause.system("test")).accepted
    with transaction.atomic(), CaptureQueriesContext(connection) as captured:
        locked, settlement, fulfillment, account = lock_intent(intent.intent_id, wallet=wallet)
        assert locked.tenant.tenant_id == funded.tenant_id and settlement.intent is locked
        assert settlement.hold.kind == "pending" and settlement.hold.amount == 150
        assert fulfillment.intent is locked and fulfillment.state == "not_started"
        assert (locked.state, locked.generation, settlement.state) == ("authorized", 1, "held")
        assert bytes(locked.forward_body) == b"" and locked.route_id == routes["ok"].pk
    assert len(captured.captured_queries) == 1
    if wallet:
        assert account.kind == "wallet" and account.tenant_id == funded.pk and account.debits_pending == 150
    else:
        assert account is None


def test_the_lock_read_of_a_missing_intent_is_a_lookup_error(db):
    with pytest.raises(LookupError):
        lock_intent("pi_missing", wallet=True)


def test_a_tenant_without_a_wallet_in_the_currency_locks_no_wallet(funded, routes):
    LedgerAccount.objects.filter(kind="wallet", tenant=funded).update(currency="eur")
    intent = _open(funded, routes["ok"])
    assert lock_intent(intent.intent_id, wallet=True)[3] is None


def test_a_relayed_answer_reads_nothing_back(funded, routes, call):
    assert call("ok", key="warm").status_code == 200
    with CaptureQueriesContext(connection) as captured:
        answer = call("ok", key="measured")
    assert answer.status_code == 200
    intent = PaymentIntent.objects.get(idempotency_key="measured")
    assert answer["AgentPay-Intent"] == intent.intent_id
    assert answer["AgentPay-Display-Status"] == intent_display_status(intent) == "COMPLETED"  # as a read shows it
    sql = [q["sql"] for q in captured.captured_queries]
    # After the answer's writes (its outbox row among them), nothing is read.
    after = sql[max(i for i, s in enumerate(sql) if s.startswith("WITH i AS (UPDATE")):]
    assert not [s for s in after if s.startswith("SELECT")]  # no composite view read for a relayed answer
    # The key (with its route and wallet) 1; the open with authorize + hold + dispatch 3 (one
    # statement in the test's savepoint); the answer with the lease cleared and the request row's
    # answer 4 (inside the test's transaction it takes the lock read: test_one_statement_paid_call)
    # (was 60, then 42 with the open, the policy read and the lease apart, then 35 with each write
    # its own statement, 16 with dispatch its own acceptance, 12 with the open in two statements)
    assert len(sql) <= 8, "\n".join(s[:100] for s in sql)
    assert not [s for s in sql if "ARRAY_AGG" in s]  # no policy read: the key's tenant, the hold's wallet
    assert not [s for s in sql if s.startswith('UPDATE "agentpay_paymentintent" SET "processing_until"')]
    assert intent.processing_until is None  # cleared by the answer's acceptance
    # The hold is taken in the open's own statement, the wallet's UPDATE guarded (open_writes).
    opens = [s for s in sql if 'INSERT INTO "agentpay_paymentintent"' in s]
    assert len(opens) == 1 and 'd AS (UPDATE "agentpay_ledgeraccount"' in opens[0]
    assert "g AS MATERIALIZED (SELECT CAST" in opens[0]
    assert 'INSERT INTO "agentpay_transfer"' in opens[0] and 'INSERT INTO "agentpay_gatewayrequest"' in opens[0]
    assert _accepted(intent) == [(0, "opened"), (1, "payload_verified"), (1, "hold_acquired"), (1, "dispatch"),
                                 (2, "upstream_2xx"), (2, "capture"), (2, "settlement_confirmed")]


def test_a_call_the_wallet_cannot_hold_is_opened_plainly_and_refused_by_the_acceptance(funded, routes, call):
    answer = call("pricey", key="short")  # 5,000 against 1,000: the hold on open refuses, all of it rolls back
    assert answer.status_code == 402 and answer.json()["type"].endswith("/insufficient-balance")
    intent = PaymentIntent.objects.get(idempotency_key="short")
    assert _accepted(intent) == [(0, "opened"), (1, "payload_verified"), (1, "hold_failed"),
                                 (1, "settlement_failed")]
    refused = IntentReceipt.objects.get(intent=intent, accepted=False)
    assert (refused.event, refused.refusal_code) == ("hold_acquired", "INSUFFICIENT_BALANCE")
    assert not Transfer.objects.filter(intent=intent).exists() and intent.processing_until is None


def test_a_frozen_tenant_takes_no_step_on_open(funded, routes, call):
    funded.status = "frozen"
    funded.save()
    assert call("ok", key="frozen").status_code == 403
    intent = PaymentIntent.objects.get(idempotency_key="frozen")
    assert _accepted(intent) == [(0, "opened"), (1, "policy_denied")]
    assert not Transfer.objects.filter(intent=intent).exists()


def test_the_embedded_database_locks_the_same_rows_through_the_orm(funded, routes, monkeypatch):
    """SQLite (the demo) has no FOR UPDATE OF: lock_intent reads the same rows one statement each."""
    intent = _open(funded, routes["ok"])
    assert intent_accept(intent_id=intent.intent_id, steps=[Step("intent", "payload_verified"),
                                                             Step("settlement", "hold_acquired")],
                         cause=Cause.system("test")).accepted
    with transaction.atomic():
        one_statement = lock_intent(intent.intent_id, wallet=True)
    monkeypatch.setattr(connections["default"], "vendor", "sqlite")
    with transaction.atomic(), CaptureQueriesContext(connection) as captured:
        orm = lock_intent(intent.intent_id, wallet=True)
    assert len(captured.captured_queries) == 4  # intent, settlement with its hold, fulfillment, wallet
    with transaction.atomic(), pytest.raises(LookupError):
        lock_intent("pi_missing", wallet=True)
    assert [(row.pk, type(row)) for row in orm] == [(row.pk, type(row)) for row in one_statement]
    assert orm[1].hold.pk == one_statement[1].hold.pk and orm[0].tenant.pk == funded.pk
