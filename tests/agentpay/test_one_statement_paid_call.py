"""A wallet call outside any transaction, as gunicorn runs it: the open is one statement with its
hold guarded on the wallet as the front read found it (open_writes), and the upstream's answer is
decided on the rows as opened and written by one statement whose compare-and-set is the guard
(acceptance.Known). Each way either can stop short goes the locked way and ends as before."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agentpay.bridge import ApiAccess, trusted_now
from agentpay.models import GatewayRequest, IntentReceipt, LedgerAccount, PaymentIntent, Transfer
from agentpay.services import intents, ledger, wallet_flow
from agentpay.services.acceptance import Known, intent_accept
from agentpay.services.intents import Opened, intent_open
from agentpay.services.ledger import ledger_release
from agentpay.services.results import Cause, RequestAnswer, Step
from agentpay.upstream import UpstreamAnswer

pytestmark = pytest.mark.django_db(transaction=True)


def _wallet(tenant) -> LedgerAccount:
    return LedgerAccount.objects.get(kind="wallet", tenant=tenant)


def _open(tenant, route, wallet_read: LedgerAccount | None, key: str | None = None) -> Opened:
    return intent_open(tenant=tenant, route=route, rail="wallet", idempotency_key=key or uuid.uuid4().hex,
                       digest="d", forward_path="", forward_query="", content_type="", body=b"",
                       request_id=uuid.uuid4(), now=trusted_now(), steps=wallet_flow.open_steps(route.price_minor),
                       wallet_read=wallet_read)


def _drive(opened: Opened, monkeypatch, status: int = 200) -> wallet_flow.Driven:
    outcome = "2xx" if status < 300 else "4xx"
    monkeypatch.setattr(wallet_flow, "upstream_forward", lambda **_: UpstreamAnswer(outcome, status=status, body=b"{}"))
    request_id = uuid.uuid4()
    return wallet_flow.intent_drive_wallet(
        intent=opened.intent, cause=Cause.request(request_id, opened.intent.tenant.tenant_id), access=ApiAccess(True),
        request_id=request_id, just_opened=opened.created, opened_lines=opened.lines,
        opened_settlement=opened.settlement, release_lease=True)


def _accepted(intent: PaymentIntent) -> list[tuple[int, str]]:
    return list(IntentReceipt.objects.filter(intent=intent, accepted=True).order_by("pk")
                .values_list("generation", "event"))


def _after_begin(sql: list[str]) -> str:
    """The first statement sent, past the transaction's BEGIN."""
    return next(s for s in sql if s != "BEGIN")


def _warm(funded, routes, monkeypatch) -> None:
    """The revenue shard exists and its id is cached in this process: the open's hold can be deferred."""
    assert _drive(_open(funded, routes["ok"], None), monkeypatch).outcome.lines.intent == "completed"


def test_a_paid_call_is_two_statements_and_takes_no_lock_read(funded, routes, monkeypatch):
    _warm(funded, routes, monkeypatch)
    with CaptureQueriesContext(connection) as captured:
        opened = _open(funded, routes["ok"], _wallet(funded), key="measured")
        driven = _drive(opened, monkeypatch)
    sql = [q["sql"] for q in captured.captured_queries]
    assert driven.outcome.accepted and driven.outcome.lines.intent == "completed"
    assert len(sql) == 3, "\n".join(s[:120] for s in sql)  # the test's wallet read, the open, the answer
    assert sql[1].startswith('WITH i AS (INSERT INTO "agentpay_paymentintent"')
    assert "g AS MATERIALIZED (SELECT CAST" in sql[1]
    assert sql[2].startswith('WITH i AS (UPDATE "agentpay_paymentintent"') and '"agentpay_transfer"' in sql[2]
    assert not [s for s in sql if "FOR UPDATE" in s or "SAVEPOINT" in s]
    intent = PaymentIntent.objects.get(idempotency_key="measured")
    assert (intent.state, intent.generation, intent.processing_until) == ("completed", 2, None)
    assert _accepted(intent) == [(0, "opened"), (1, "payload_verified"), (1, "hold_acquired"), (1, "dispatch"),
                                 (2, "upstream_2xx"), (2, "capture"), (2, "settlement_confirmed")]
    assert sorted(Transfer.objects.filter(intent=intent).values_list("kind", flat=True)) == ["pending", "post_pending"]
    assert _wallet(funded).available == 1000 - 2 * 150


def test_a_4xx_is_released_by_the_one_statement(funded, routes, monkeypatch):
    _warm(funded, routes, monkeypatch)
    driven = _drive(_open(funded, routes["ok"], _wallet(funded)), monkeypatch, status=404)
    assert driven.outcome.accepted and driven.outcome.lines.settlement == "released"
    assert _wallet(funded).available == 1000 - 150 and _wallet(funded).debits_pending == 0


@pytest.mark.parametrize("change", ["drained", "frozen"])
def test_a_wallet_that_stopped_taking_the_hold_after_it_was_read_is_refused_by_the_acceptance(
        funded, routes, monkeypatch, change):
    _warm(funded, routes, monkeypatch)
    read = _wallet(funded)  # 850 available, unfrozen, as the front read saw it
    if change == "drained":
        LedgerAccount.objects.filter(pk=read.pk).update(debits_posted=read.debits_posted + 800)
    else:
        LedgerAccount.objects.filter(pk=read.pk).update(frozen=True)
    with CaptureQueriesContext(connection) as captured:
        opened = _open(funded, routes["ok"], read, key="behind")
    assert opened.created and opened.lines.intent == "created"  # opened plainly: nothing of the hold written
    tried = [q["sql"] for q in captured.captured_queries if "g AS MATERIALIZED" in q["sql"]]
    assert len(tried) == 1  # the guarded open was sent, and failed as a whole
    driven = _drive(opened, monkeypatch)
    assert driven.refusal == ("INSUFFICIENT_BALANCE" if change == "drained" else "WALLET_FROZEN")
    intent = PaymentIntent.objects.get(idempotency_key="behind")
    assert _accepted(intent) == [(0, "opened"), (1, "payload_verified"), (1, "hold_failed"), (1, "settlement_failed")]
    assert not Transfer.objects.filter(intent=intent).exists()
    assert _wallet(funded).debits_pending == 0
    if change == "drained":
        LedgerAccount.objects.filter(pk=read.pk).update(debits_posted=read.debits_posted)  # the audit's totals


def test_an_answer_after_another_generation_is_decided_on_the_rows_as_they_are(funded, routes, monkeypatch):
    _warm(funded, routes, monkeypatch)
    opened = _open(funded, routes["ok"], _wallet(funded))
    # The upstream's 5xx was accepted behind this request (generation 2): its known rows are stale.
    assert intent_accept(intent_id=opened.intent.intent_id, steps=[Step("fulfillment", "upstream_5xx",
                                                                        {"status": 503})],
                         cause=Cause.system("test")).accepted
    with CaptureQueriesContext(connection) as captured:
        driven = _drive(opened, monkeypatch)
    sql = [q["sql"] for q in captured.captured_queries]
    # The known rows' statement wrote nothing (its compare-and-set found generation 2); the locked
    # way read the rows as they are and refused: an unknown fulfillment takes no upstream_2xx.
    assert sql[0].startswith('WITH i AS (UPDATE "agentpay_paymentintent"')
    assert "FOR UPDATE OF i, s, f" in _after_begin(sql[1:])
    intent = PaymentIntent.objects.get(pk=opened.intent.pk)
    assert not driven.outcome.accepted and driven.outcome.generation == intent.generation == 2
    assert (intent.state, intent.fulfillment.state, intent.settlements.get().state) == ("authorized", "unknown", "held")
    assert IntentReceipt.objects.filter(intent=intent, accepted=False, event="upstream_2xx").count() == 1
    assert list(Transfer.objects.filter(intent=intent).values_list("kind", flat=True)) == ["pending"]
    assert _wallet(funded).debits_pending == 150


def test_a_hold_resolved_behind_the_known_rows_writes_nothing_and_is_refused(funded, routes, monkeypatch):
    _warm(funded, routes, monkeypatch)
    opened = _open(funded, routes["ok"], _wallet(funded))
    hold = opened.settlement.hold
    # Behind the acceptance (no generation moved): the ledger's own release, as a bug would.
    ledger_release(hold=hold, actor="test", now=trusted_now(), reason="behind the acceptance")
    with CaptureQueriesContext(connection) as captured:
        driven = _drive(opened, monkeypatch)
    sql = [q["sql"] for q in captured.captured_queries]
    assert sql[0].startswith('WITH i AS (UPDATE "agentpay_paymentintent"') and "ON CONFLICT" not in sql[0]
    assert "FOR UPDATE OF i, s, f" in _after_begin(sql[1:])  # then the locked way
    assert not driven.outcome.accepted and driven.outcome.refusal_code == "HOLD_ALREADY_RESOLVED"
    intent = PaymentIntent.objects.get(pk=opened.intent.pk)
    assert (intent.generation, intent.state) == (1, "authorized")
    assert list(Transfer.objects.filter(pending=hold).values_list("kind", flat=True)) == ["void_pending"]
    assert not IntentReceipt.objects.filter(intent=intent, generation=2).exists()


@pytest.mark.parametrize(("route", "status"), [("ok", 200), ("bad", 422)])
def test_a_relayed_answer_is_written_into_the_request_row_by_the_acceptance(funded, routes, call, route, status):
    assert call("ok", key="warm").status_code == 200  # the revenue shard's id is cached
    with CaptureQueriesContext(connection) as captured:
        answer = call(route, key="measured")
    assert answer.status_code == status
    sql = [q["sql"] for q in captured.captured_queries]
    # The key with its route and wallet, the open, the answer with the row's answer: nothing after.
    assert len(sql) == 3, "\n".join(s[:120] for s in sql)
    assert 'q AS (UPDATE "agentpay_gatewayrequest"' in sql[2]
    row = GatewayRequest.objects.get(idempotency_key="measured")
    assert (row.answer_status, row.answer_problem, row.intent.idempotency_key) == (status, "", "measured")
    assert row.answered_at is not None and row.duration_ms is not None


def test_an_answer_the_gateway_does_not_relay_is_written_as_it_leaves(funded, routes, call):
    assert call("ok", key="warm").status_code == 200
    with CaptureQueriesContext(connection) as captured:
        answer = call("boom", key="five")  # 5xx: unknown, the hold kept, a 502 problem
    assert answer.status_code == 502
    sql = [q["sql"] for q in captured.captured_queries]
    assert not [s for s in sql if 'q AS (UPDATE "agentpay_gatewayrequest"' in s]
    assert sql[-1].startswith('UPDATE "agentpay_gatewayrequest"')
    row = GatewayRequest.objects.get(idempotency_key="five")
    assert (row.answer_status, row.answer_problem) == (502, answer.json()["type"].rsplit("/", 1)[1])


def test_a_refused_answer_leaves_the_request_row_to_the_gateway(funded, routes, monkeypatch):
    _warm(funded, routes, monkeypatch)
    opened = _open(funded, routes["ok"], _wallet(funded))
    request_id = uuid.uuid4()
    GatewayRequest.objects.create(request_id=request_id, received_at=trusted_now(), method="POST", path="/x",
                                  intent=opened.intent)
    ledger_release(hold=opened.settlement.hold, actor="test", now=trusted_now(), reason="behind the acceptance")
    monkeypatch.setattr(wallet_flow, "upstream_forward", lambda **_: UpstreamAnswer("2xx", status=200, body=b"{}"))
    written = RequestAnswer(request_id=request_id, status=200, problem="", answered_at=trusted_now(), duration_ms=5)
    driven = wallet_flow.forward_and_accept(
        opened.intent, Cause.system("test"), opened.intent.fulfillment.fulfillment_id, request_id,
        wallet_flow.ANSWER_STEPS, known=Known(opened.intent, opened.settlement, opened.intent.fulfillment),
        answered=lambda upstream: written)
    assert not driven.outcome.accepted and driven.answer_logged is None
    assert GatewayRequest.objects.get(request_id=request_id).answer_status is None  # the gateway's UPDATE writes it



def test_a_stale_cached_system_account_id_fails_the_guarded_open_and_it_is_opened_again(funded, routes, monkeypatch):
    _warm(funded, routes, monkeypatch)
    read = _wallet(funded)
    key = ("revenue", "usd", ledger.system_shard(read.pk))
    real = ledger._SYSTEM_IDS[key]
    ledger._SYSTEM_IDS[key] = 10**12  # as after a flushed table
    with CaptureQueriesContext(connection) as captured:
        opened = _open(funded, routes["ok"], read, key="stale")
    assert [q["sql"] for q in captured.captured_queries if "g AS MATERIALIZED" in q["sql"]]  # tried, failed
    assert opened.lines.settlement == "held" and ledger._SYSTEM_IDS[key] == real  # looked up again
    hold = Transfer.objects.get(intent=opened.intent, kind="pending")
    assert hold.credit_account_id == real and opened.settlement.hold_id == hold.pk
    assert PaymentIntent.objects.filter(idempotency_key="stale").count() == 1
    assert _drive(opened, monkeypatch).outcome.lines.intent == "completed"


def test_an_id_forgotten_by_another_thread_mid_open_opens_the_locked_way_and_keeps_the_cache(funded, routes,
                                                                                             monkeypatch):
    _warm(funded, routes, monkeypatch)
    read = _wallet(funded)
    key = ("revenue", "usd", ledger.system_shard(read.pk))
    other = ("revenue", "eur", 0)
    ledger._SYSTEM_IDS[other] = 7  # another currency's id: not this open's to forget
    # Another thread forgot this id after the open checked it (intents._guarded_hold) and before
    # the hold was made (ledger_hold): the intent is not inserted, so nothing can be written there.
    checked = intents.hold_deferrable
    monkeypatch.setattr(intents, "hold_deferrable", lambda wallet: checked(wallet) and bool(
        ledger._SYSTEM_IDS.pop(key)))
    opened = _open(funded, routes["ok"], read, key="forgotten")
    monkeypatch.setattr(intents, "hold_deferrable", checked)
    assert opened.created and opened.lines.settlement == "held"
    assert ledger._SYSTEM_IDS.get(other) == 7
    del ledger._SYSTEM_IDS[other]
    assert _drive(opened, monkeypatch).outcome.lines.intent == "completed"
