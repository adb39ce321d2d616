"""The seeded AgentPay simulation (issue 17 item 8): agents in threads with fresh and duplicated
keys, an upstream answering 2xx / 4xx / 5xx / hanging / dropping, crashes after every kind of
commit, jobs late, early and ahead of the clock — and the auditor after every step.

Scale for the nightly run: AGENTPAY_SIM_SEEDS ("1-40" or "3,9,11") and AGENTPAY_SIM_STEPS (steps
per seed). Each broken-world test below injects one violation the product cannot make (a raw SQL
write, a constraint dropped inside the test's transaction) and proves the auditor names it.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import replace
from unittest import mock

import pytest
from django.db import connection, transaction

from tests.verification.agentpay_sim import Schedule, Simulation, Step, generate


def _seeds() -> list[int]:
    text = os.environ.get("AGENTPAY_SIM_SEEDS", "1-3")
    if "-" in text:
        low, high = text.split("-")
        return list(range(int(low), int(high) + 1))
    return [int(s) for s in text.split(",") if s.strip()]


STEPS = int(os.environ.get("AGENTPAY_SIM_STEPS", "100"))
TOTALS = {"steps": 0, "seconds": 0.0}


@pytest.mark.race
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("seed", _seeds())
def test_seed_has_no_invariant_violation(seed):
    started = time.perf_counter()
    result = Simulation(generate(seed, STEPS)).run()
    TOTALS["steps"] += result.steps_run
    TOTALS["seconds"] += time.perf_counter() - started
    print(f"\nagentpay seed {seed}: {result.steps_run} steps in {result.seconds:.1f}s "
          f"({result.steps_run / result.seconds:.1f} steps/s); total {TOTALS['steps']} steps in "
          f"{TOTALS['seconds']:.1f}s")
    print("  " + ", ".join(f"{k} {v}" for k, v in sorted(result.counters.items())))
    assert result.ok, f"seed {seed}: {len(result.violations)} violation(s):\n" + "\n".join(
        map(str, result.violations[:20]))


# An agent whose request dies right after its hold committed, and that never retries. A fresh
# call's open commits its hold with its dispatch (wallet_flow.open_steps), so the crash leaves a
# dispatched call the upstream never saw (the status query resolves it); a hold is left
# undispatched only by a resumed intent's hold acceptance (a retry of a key opened plainly) whose
# request dies before its dispatch: `_undispatched_hold` leaves one, before the first step.
ABANDONED_AFTER_HOLD = Schedule(seed=0, tenants=2, balances=(3000, 1000), abandon_every=1, steps=(
    Step("crash", what="settlement.hold_acquired"), Step("call", what="ok"), Step("call", what="boom")))


def _undispatched_hold(sim: Simulation, step: int) -> None:
    """Before the schedule's first step: an intent held and not dispatched, its request gone (its
    lease lapses as the clock moves), as a resumed hold acceptance leaves it."""
    if step != 0:
        return
    from agentpay.bridge import trusted_now
    from agentpay.models import PricedRoute
    from agentpay.services.intents import intent_open
    from agentpay.services.wallet_flow import authorize_and_hold

    route = PricedRoute.objects.get(slug="ok")
    opened = intent_open(tenant=sim.tenants[0], route=route, rail="wallet", idempotency_key="sim-undispatched",
                         digest="d", forward_path="", forward_query="", content_type="", body=b"",
                         request_id=uuid.uuid4(), now=trusted_now(), steps=authorize_and_hold(route.price_minor))
    assert (opened.lines.settlement, opened.lines.fulfillment) == ("held", "not_started")


@pytest.mark.django_db(transaction=True)
def test_an_abandoned_undispatched_hold_expires_by_the_end():
    result = Simulation(ABANDONED_AFTER_HOLD, inject=_undispatched_hold).run()
    assert result.ok, "\n".join(map(str, result.violations))
    assert result.counters["crash:settlement.hold_acquired"] == 1  # dispatched with it: resolved, not expired
    assert result.counters["end:expired/not_started"] == 1  # released by agentpay_hold_expiry
    assert result.counters["holds_expired"] == 1
    # The crashed call (its status query: never executed) and the boom call end too.
    assert sum(v for k, v in result.counters.items() if k.startswith("end:")) == 3


@pytest.mark.django_db(transaction=True)
def test_the_auditor_catches_a_hold_pending_after_every_deadline():
    """Without the expiry job, the abandoned hold is held for ever: the drain's retries no longer
    hide it, and the auditor names it."""
    from agentpay import jobs

    with mock.patch.dict(jobs.JOBS, {"agentpay_hold_expiry": lambda run: None}):
        result = Simulation(ABANDONED_AFTER_HOLD, inject=_undispatched_hold).run()
    assert "HOLD_PENDING_PAST_DEADLINES" in {v.code for v in result.violations}
    assert "STUCK_AFTER_DRAIN" in {v.code for v in result.violations}


def _sql(statement: str, params: tuple = ()) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


# Appended to every broken world, so each injection finds what it breaks: a captured call, a
# released one, and two calls whose outcome is unknown (held).
ENDING = tuple(Step("call", what=what) for what in ("ok", "bad", "boom", "boom"))


def _broken(inject, steps: int = 30, seed: int = 7) -> set[str]:
    """Run a short schedule, inject after its last step inside a transaction that is rolled back
    (so dropped constraints come back), and return the codes the auditor reported."""
    codes: set[str] = set()
    schedule = generate(seed, steps, concurrency=False)
    schedule = replace(schedule, steps=schedule.steps + ENDING)
    last = len(schedule.steps) - 1

    class Rollback(Exception):
        pass

    def at_end(sim: Simulation, step: int) -> None:
        if step == steps - 1:
            sim.faults.disarm()  # the ending's calls run to their answers
        if step != last:
            return
        assert not sim.auditor.violations, sim.auditor.violations
        try:
            with transaction.atomic():
                inject()
                sim.auditor.check(step)
                codes.update(v.code for v in sim.auditor.violations)
                raise Rollback
        except Rollback:
            pass

    Simulation(schedule, drain=False, inject=at_end).run()
    return codes


def _one(sql: str) -> tuple:
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchone()


@pytest.mark.django_db(transaction=True)
def test_the_auditor_catches_a_double_release():
    def inject():
        _sql("DROP INDEX hold_resolved_once")
        _sql("ALTER TABLE agentpay_transfer DISABLE TRIGGER USER")
        _sql("""INSERT INTO agentpay_transfer (transfer_id, kind, debit_account_id, credit_account_id, amount,
                currency, pending_id, intent_id, reason, ticket, external_ref, actor, created_at)
                SELECT 'xfr_injected', 'void_pending', r.debit_account_id, r.credit_account_id, r.amount,
                       r.currency, r.pending_id, r.intent_id, 'injected', '', '', 'test', now()
                FROM agentpay_transfer r WHERE r.kind = 'void_pending' ORDER BY r.id LIMIT 1""")

    assert "HOLD_RESOLVED_TWICE" in _broken(inject)


@pytest.mark.django_db(transaction=True)
def test_the_auditor_catches_an_unbalanced_ledger_and_a_negative_wallet():
    def inject():
        _sql("ALTER TABLE agentpay_ledgeraccount DROP CONSTRAINT wallet_available_non_negative")
        _sql("UPDATE agentpay_ledgeraccount SET debits_posted = credits_posted + 1 WHERE id = "
             "(SELECT MIN(id) FROM agentpay_ledgeraccount WHERE kind = 'wallet')")

    codes = _broken(inject)
    assert {"LEDGER_UNBALANCED", "ACCOUNT_TOTALS_MISMATCH", "NEGATIVE_AVAILABLE"} <= codes


@pytest.mark.django_db(transaction=True)
def test_the_auditor_catches_a_capture_without_a_2xx_and_a_release_while_unknown():
    def inject():
        from agentpay.models import PaymentIntent, Transfer

        unknown = list(PaymentIntent.objects.filter(fulfillment__state="unknown", settlements__state="held")
                       .order_by("pk")[:2])
        assert len(unknown) == 2, "the schedule left too few unknown fulfillments to break"
        for intent, kind in zip(unknown, ("post_pending", "void_pending"), strict=True):
            hold = intent.settlements.get().hold
            Transfer.objects.create(transfer_id=f"xfr_inj_{kind}", kind=kind, debit_account_id=hold.debit_account_id,
                                    credit_account_id=hold.credit_account_id, amount=hold.amount,
                                    currency=hold.currency, pending=hold, intent=intent, actor="test",
                                    created_at=hold.created_at)

    codes = _broken(inject)
    assert {"CAPTURE_WITHOUT_2XX", "RELEASE_WHILE_UNKNOWN", "ACCOUNT_TOTALS_MISMATCH"} <= codes


@pytest.mark.django_db(transaction=True)
def test_the_auditor_catches_a_terminal_state_changed():
    def inject():
        _sql("UPDATE agentpay_paymentintent SET state = 'failed' WHERE id = "
             "(SELECT MIN(id) FROM agentpay_paymentintent WHERE state = 'completed')")

    assert "TERMINAL_STATE_CHANGED" in _broken(inject)


@pytest.mark.django_db(transaction=True)
def test_the_auditor_catches_two_intents_for_one_key():
    def inject():
        _sql("ALTER TABLE agentpay_paymentintent DROP CONSTRAINT one_intent_per_tenant_key")
        columns = [c for c, in _rows("""SELECT column_name FROM information_schema.columns
                                       WHERE table_name = 'agentpay_paymentintent' AND column_name NOT IN
                                       ('id', 'intent_id')""")]
        names = ", ".join(columns)
        _sql(f"""INSERT INTO agentpay_paymentintent (intent_id, {names})
                 SELECT 'pi_injected', {names} FROM agentpay_paymentintent ORDER BY id LIMIT 1""")

    assert "DUPLICATE_INTENT_FOR_KEY" in _broken(inject)


def _rows(sql: str) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchall()
