"""Release gates (SPEC §15): a healthy data set built through the real services passes every gate;
each deliberate corruption fails the gate that guards against it (and the command exits 1)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from dunning.acceptance.aggregate import EMPTY_ROOT
from dunning.acceptance.inputs import Cause
from dunning.acceptance.settlement import cycle_view
from dunning.clock import trusted_now
from dunning.evidence.processing import event_process
from dunning.gates import GATE_DEFINITIONS, _view, gates_evaluate
from dunning.models import (
    AttemptOrigin,
    CauseKind,
    DunningCycle,
    EventOutcome,
    FactKind,
    MonetaryFact,
    PaymentAttempt,
    ProviderEvent,
    TransitionReceipt,
)
from dunning.states import DELINQUENT_STATES
from entitlements.models import EntitlementSnapshot
from subscriptions.models import Subscription
from tests.support.builders import (
    accept,
    fail_first_payment,
    invoice_receipt,
    local_policy,
    make_subscription,
    open_cycle,
    paid_evidence,
    reload,
    restrict,
)

ALL_GATES = list(GATE_DEFINITIONS)


@dataclass
class Scenario:
    sim_recovered: DunningCycle  # renewal failed, the customer paid, recovered through the webhook path
    sim_grace: DunningCycle  # renewal failed, provider retry scheduled
    grace: DunningCycle
    restricted: DunningCycle
    restricted_at: datetime
    paid_of_two: DunningCycle  # two open invoices on one subscription, this one paid
    open_of_two: DunningCycle
    unknown: DunningCycle  # LOCAL retry whose outcome is unknown, entered just now


def _cycle_for_invoice(invoice_id: str) -> DunningCycle:
    return DunningCycle.objects.select_related("subscription", "invoice").get(invoice__provider_invoice_id=invoice_id)


def _local_unknown(*, now: datetime | None = None) -> DunningCycle:
    sub = make_subscription(price="price_local", now=now)
    cycle = open_cycle(sub, now=now)
    fail_first_payment(cycle, now=now)
    for edge in ("schedule_retry", "prepare_retry", "dispatch_retry", "mark_unknown"):
        assert accept(cycle, edge, now=now), edge
    return reload(cycle)


@pytest.fixture
def scenario(sim, policy) -> Scenario:
    local_policy()
    # Through the provider simulator and the webhook endpoint.
    payer = sim.create_customer("payer@example.com", card="ok")
    payer_sub = sim.create_subscription(payer, "price_monthly_pro", amount=4900)
    late = sim.create_customer("late@example.com", card="ok")
    late_sub = sim.create_subscription(late, "price_monthly_pro", amount=4900)
    sim.deliver_all()
    sim.set_card(payer, "insufficient_funds")
    sim.set_card(late, "insufficient_funds")
    paid_invoice = sim.create_renewal_invoice(payer_sub)
    late_invoice = sim.create_renewal_invoice(late_sub)
    sim.provider_attempt(paid_invoice)
    sim.provider_attempt(late_invoice)
    sim.deliver_all()
    sim.customer_pays(paid_invoice, update_card=True)
    sim.deliver_all()
    # Through the acceptance service directly.
    grace = open_cycle(make_subscription())
    fail_first_payment(grace)
    restricted = open_cycle(make_subscription())
    fail_first_payment(restricted)
    restricted_at = restrict(restricted)
    two = make_subscription()
    paid_of_two, open_of_two = open_cycle(two), open_cycle(two)
    fail_first_payment(paid_of_two)
    fail_first_payment(open_of_two)
    assert accept(paid_of_two, "recover", evidence=paid_evidence(paid_of_two))
    unknown = _local_unknown()
    return Scenario(
        sim_recovered=_cycle_for_invoice(paid_invoice), sim_grace=_cycle_for_invoice(late_invoice),
        grace=reload(grace), restricted=reload(restricted), restricted_at=restricted_at,
        paid_of_two=reload(paid_of_two), open_of_two=reload(open_of_two), unknown=unknown,
    )


def run_gates(*args: str) -> tuple[int, str]:
    out = StringIO()
    try:
        call_command("dunning_gates", *args, stdout=out, stderr=StringIO())
    except CommandError as exc:
        return exc.returncode, out.getvalue()
    return 0, out.getvalue()


def failed_gates(**kwargs) -> list[str]:
    return [g.key for g in gates_evaluate(**kwargs).failed]


# --- the healthy data set ---


def test_scenario_is_what_it_claims(scenario):
    s = scenario
    assert s.sim_recovered.state == "RECOVERED" and s.sim_recovered.subscription.entitlement_profile == "FULL"
    assert s.sim_grace.state == "RETRY_SCHEDULED"
    assert s.sim_grace.subscription.entitlement_profile == "READ_EXPORT_NO_NEW_JOBS"
    assert s.grace.state == "GRACE_ACTIVE"
    assert s.restricted.state == "RESTRICTED" and s.restricted.subscription.entitlement_profile == "SUSPENDED"
    assert s.paid_of_two.state == "RECOVERED" and s.open_of_two.state == "GRACE_ACTIVE"
    assert s.open_of_two.subscription.outstanding_cycle_root != EMPTY_ROOT
    assert s.open_of_two.subscription.entitlement_profile == "READ_EXPORT_NO_NEW_JOBS"
    assert s.unknown.state == "PAYMENT_UNKNOWN"
    assert ProviderEvent.objects.filter(event_type="invoice.paid", invoice=s.sim_recovered.invoice).exists()


def test_healthy_data_passes_every_gate_with_the_expected_figures(scenario):
    report = gates_evaluate()
    assert report.failed == [], [(g.key, g.display, g.detail) for g in report.failed]
    assert [g.key for g in report.gates] == ALL_GATES
    figures = {g.key: g for g in report.gates}
    events = ProviderEvent.objects.count()
    assert events > 10
    assert (figures["event_attribution"].figure, figures["event_attribution"].sample_size) == (100.0, events)
    subscriptions = Subscription.objects.count()
    assert subscriptions == 6
    assert (figures["root_consistency"].figure, figures["root_consistency"].sample_size) == (100.0, subscriptions)
    for key in ("duplicate_charges", "full_while_blocking", "restriction_without_fresh_receipt",
                "stale_generation_commits", "blind_retries"):
        assert figures[key].figure == 0, key
    assert figures["restriction_without_fresh_receipt"].sample_size == 1
    assert figures["blind_retries"].sample_size == 1
    # Both sim subscriptions' first invoices, the paid renewal, and the paid one of two.
    recovered = DunningCycle.objects.filter(state="RECOVERED").count()
    assert recovered == 4
    p99 = figures["payment_to_recovery_p99"]
    assert p99.sample_size == recovered and p99.figure is not None and 0 <= p99.figure < 60
    unknown = figures["unknown_owned_within_1h"]
    assert (unknown.figure, unknown.sample_size) == (100.0, 1)


def test_command_exits_zero_and_prints_a_table_and_json(scenario):
    code, table = run_gates()
    assert code == 0
    assert f"Overall: PASS ({len(ALL_GATES)}/{len(ALL_GATES)} gates pass)" in table
    for gate in gates_evaluate().gates:
        assert gate.name in table
    code, text = run_gates("--json")
    assert code == 0
    report = json.loads(text)
    assert report["passed"] is True and report["failed"] == []
    assert [g["key"] for g in report["gates"]] == ALL_GATES
    assert all(g["passed"] and g["definition"] for g in report["gates"])
    assert {"name", "figure", "display", "unit", "threshold", "detail", "sample_size"} <= set(report["gates"][0])


def test_no_data_passes_with_empty_samples(db):
    report = gates_evaluate()
    assert report.passed
    assert report.gate("payment_to_recovery_p99").display == "n/a"
    assert report.gate("event_attribution").display == "100.00 % (n=0)"


def test_gate_views_match_the_acceptance_service_views(scenario):
    """The gate streams plain values; they must build exactly the views acceptance builds."""
    from dunning.gates import _CYCLE_VIEW_FIELDS, _PolicySpecs

    specs = _PolicySpecs()
    cycles = DunningCycle.objects.filter(state__in=DELINQUENT_STATES).select_related("invoice", "policy")
    assert cycles.count() >= 5
    for cycle in cycles:
        row = DunningCycle.objects.filter(pk=cycle.pk).values(*_CYCLE_VIEW_FIELDS).get()
        assert _view(row, specs) == cycle_view(cycle)


# --- each corruption fails its gate ---


def test_corrupt_root_fails_root_consistency_and_the_command(scenario):
    sub = scenario.grace.subscription
    Subscription.objects.filter(pk=sub.pk).update(outstanding_cycle_root="corrupt")
    assert failed_gates() == ["root_consistency"]
    code, text = run_gates("--json")
    assert code == 1
    gate = next(g for g in json.loads(text)["gates"] if g["key"] == "root_consistency")
    assert gate["passed"] is False and gate["detail"] == [sub.provider_subscription_id]
    code, table = run_gates()
    assert code == 1 and "FAIL" in table and sub.provider_subscription_id in table


def _restriction_receipt(cycle: DunningCycle, *, evidence=None, cause_kind=CauseKind.JOB, edge="begin_restriction",
                         now: datetime | None = None) -> TransitionReceipt:
    """What a broken build would write: an accepted restriction with whatever evidence it had."""
    sub = cycle.subscription
    return TransitionReceipt.objects.create(
        subscription=sub, cycle=cycle, edge=edge, accepted=True, from_state="GRACE_EXPIRED", to_state="RESTRICTING",
        cause_kind=cause_kind, cause_ref="grace_expiry", actor="job:grace_expiry",
        root_before=sub.outstanding_cycle_root, root_after=sub.outstanding_cycle_root,
        decision_profile=sub.entitlement_profile, entitlement_generation=sub.entitlement_generation,
        evidence_receipt=evidence, policy=cycle.policy, trusted_time=now or trusted_now(),
    )


@pytest.mark.parametrize("fault", ["missing", "stale", "paid", "other_invoice"])
def test_restriction_without_fresh_unpaid_receipt_fails(scenario, fault):
    cycle, now = scenario.grace, trusted_now()
    evidence = {
        "missing": lambda: None,
        "stale": lambda: invoice_receipt(cycle, "open", fetched_at=now - timedelta(hours=1)),
        "paid": lambda: invoice_receipt(cycle, "paid", fetched_at=now),
        "other_invoice": lambda: invoice_receipt(scenario.open_of_two, "open", fetched_at=now),
    }[fault]()
    receipt = _restriction_receipt(cycle, evidence=evidence, now=now)
    report = gates_evaluate()
    assert [g.key for g in report.failed] == ["restriction_without_fresh_receipt"]
    gate = report.gate("restriction_without_fresh_receipt")
    assert gate.figure == 1 and gate.sample_size == 2
    assert gate.detail[0].startswith(f"receipt {receipt.pk} begin_restriction")


def test_fresh_unpaid_receipt_and_staff_decisions_pass(scenario):
    cycle, now = scenario.grace, trusted_now()
    _restriction_receipt(cycle, evidence=invoice_receipt(cycle, "uncollectible", fetched_at=now - timedelta(
        seconds=200)), now=now)
    _restriction_receipt(cycle, evidence=None, cause_kind=CauseKind.USER, now=now)
    assert "restriction_without_fresh_receipt" not in failed_gates()


def test_second_successful_charge_fails_duplicate_charges(scenario):
    cycle = scenario.sim_recovered
    first = MonetaryFact.objects.get(invoice=cycle.invoice, kind=FactKind.PAYMENT_SUCCEEDED)
    assert first.provider_ref
    now = trusted_now()
    MonetaryFact.objects.create(
        kind=FactKind.PAYMENT_SUCCEEDED, invoice=cycle.invoice, cycle=cycle, amount=first.amount,
        currency=first.currency, provider_ref="pi_charged_twice", dedupe_key=f"paid-again:{cycle.invoice_id}",
        occurred_at=now, recorded_at=now,
    )
    report = gates_evaluate()
    assert [g.key for g in report.failed] == ["duplicate_charges"]
    assert report.gate("duplicate_charges").detail == (cycle.invoice.provider_invoice_id,)


def test_two_succeeded_attempts_on_one_cycle_fail_duplicate_charges(scenario):
    cycle = scenario.paid_of_two
    now = trusted_now()
    for n in (1, 2):
        PaymentAttempt.objects.create(
            cycle=cycle, origin=AttemptOrigin.PROVIDER, idempotency_key=f"provider:{cycle.invoice_id}:dup{n}",
            invoice_digest="x", amount=cycle.amount, currency=cycle.currency, state="SUCCEEDED", created_at=now,
            resolved_at=now,
        )
    assert failed_gates() == ["duplicate_charges"]


def _inbox(event_type: str, obj: dict, *, received_at: datetime | None = None) -> ProviderEvent:
    now = received_at or trusted_now()
    return ProviderEvent.objects.create(
        event_id=f"evt_gate_{obj['id']}_{event_type}", event_type=event_type, account="acct_demo",
        payload={"id": "evt", "type": event_type, "data": {"object": obj}}, signature_verified=True,
        received_at=now,
    )


def test_unattributable_event_fails_attribution(scenario):
    event = _inbox("payment_intent.succeeded", {"id": "pi_nobody_knows", "object": "payment_intent"})
    assert event_process(event_pk=event.pk) == EventOutcome.UNATTRIBUTABLE  # the real processing path
    report = gates_evaluate()
    assert [g.key for g in report.failed] == ["event_attribution"]
    gate = report.gate("event_attribution")
    assert gate.offending == 1 and gate.figure < 100
    assert gate.detail == (f"{event.event_id} (UNATTRIBUTABLE)",)


def test_event_nobody_processed_fails_attribution_after_ten_minutes(scenario):
    now = trusted_now()
    event = _inbox("invoice.paid", {"id": "in_never_processed"}, received_at=now - timedelta(minutes=11))
    assert gates_evaluate(now=now - timedelta(minutes=2)).passed  # still in flight
    assert failed_gates(now=now) == ["event_attribution"]
    assert event.event_id in gates_evaluate(now=now).gate("event_attribution").detail[0]


def test_unknown_payment_unowned_for_two_hours_fails_ownership(scenario):
    entered = trusted_now() - timedelta(hours=2)
    cycle = _local_unknown(now=entered)
    report = gates_evaluate()
    assert [g.key for g in report.failed] == ["unknown_owned_within_1h"]
    gate = report.gate("unknown_owned_within_1h")
    assert (gate.offending, gate.sample_size) == (1, 2)
    assert gate.detail[0].startswith(f"cycle {cycle.cycle_id}")
    # The same data evaluated 30 minutes after it entered: the hour has not run out yet.
    assert gates_evaluate(now=entered + timedelta(minutes=30)).passed
    code, _ = run_gates("--now", (entered + timedelta(minutes=30)).isoformat())
    assert code == 0


def test_unknown_payment_owned_within_the_hour_passes(scenario, staff):
    entered = trusted_now() - timedelta(hours=2)
    cycle = _local_unknown(now=entered)
    assert accept(cycle, "assign_unknown_owner", owner=staff, now=entered + timedelta(minutes=40))
    assert gates_evaluate().passed


def test_unknown_payment_owned_too_late_fails(scenario, staff):
    entered = trusted_now() - timedelta(hours=3)
    cycle = _local_unknown(now=entered)
    assert accept(cycle, "assign_unknown_owner", owner=staff, now=entered + timedelta(minutes=90))
    assert failed_gates() == ["unknown_owned_within_1h"]


def test_full_access_while_debt_remains_fails(scenario):
    sub = scenario.grace.subscription
    Subscription.objects.filter(pk=sub.pk).update(entitlement_profile="FULL")
    report = gates_evaluate()
    assert [g.key for g in report.failed] == ["full_while_blocking"]
    assert report.gate("full_while_blocking").detail[0].startswith(sub.provider_subscription_id)


def test_full_snapshot_issued_while_debt_remained_fails(scenario):
    sub = Subscription.objects.get(pk=scenario.grace.subscription_id)
    cause = TransitionReceipt.objects.filter(subscription=sub, accepted=True).latest("pk")
    assert cause.root_after != EMPTY_ROOT
    EntitlementSnapshot.objects.create(subscription=sub, generation=sub.entitlement_generation + 1, profile="FULL",
                                       capabilities={}, reason="broken build", issued_at=trusted_now(),
                                       cause_receipt=cause)
    report = gates_evaluate()
    assert "full_while_blocking" in [g.key for g in report.failed]
    assert any(f"{sub.provider_subscription_id}@{sub.entitlement_generation + 1}" in d
               for d in report.gate("full_while_blocking").detail)


def test_full_exception_explains_full_access_with_debt(scenario, staff):
    cycle, at = scenario.restricted, scenario.restricted_at + timedelta(minutes=1)
    granted = accept(cycle, "grant_exception", cause=Cause.staff(staff, reason="hospital stay", ticket="T-1"),
                     expires_at=at + timedelta(days=3), profile="FULL", now=at)
    assert granted and granted.profile == "FULL" and granted.snapshot_issued
    assert reload(cycle).subscription.outstanding_cycle_root != EMPTY_ROOT
    report = gates_evaluate()
    assert report.passed, [(g.key, g.detail) for g in report.failed]
    assert report.gate("full_while_blocking").sample_size > Subscription.objects.count()


def test_duplicate_generation_commit_fails_stale_generation(scenario):
    original = (TransitionReceipt.objects.filter(cycle=scenario.grace, accepted=True, edge="start_grace").get())
    replay = TransitionReceipt.objects.get(pk=original.pk)
    replay.pk = None
    replay._state.adding = True
    replay.save()
    report = gates_evaluate()
    assert [g.key for g in report.failed] == ["stale_generation_commits"]
    assert any(f"receipt {replay.pk}" in d for d in report.gate("stale_generation_commits").detail)


def test_commit_built_on_an_older_generation_fails_stale_generation(scenario):
    """Accepted with expected generation g-2 yet committed as g+1: the CAS was not honoured."""
    cycle = scenario.grace
    last = TransitionReceipt.objects.filter(cycle=cycle, accepted=True).latest("pk")
    stale = TransitionReceipt.objects.create(
        subscription=cycle.subscription, cycle=cycle, edge="schedule_retry", accepted=True,
        from_state="GRACE_ACTIVE", to_state="RETRY_SCHEDULED", cause_kind=CauseKind.JOB, actor="job:retry",
        expected={**last.expected, "cycle_generation": cycle.generation - 2}, cycle_generation=cycle.generation + 1,
        root_before=last.root_after, root_after=last.root_after, decision_profile=last.decision_profile,
        entitlement_generation=last.entitlement_generation, policy=cycle.policy, trusted_time=trusted_now(),
    )
    report = gates_evaluate()
    assert [g.key for g in report.failed] == ["stale_generation_commits"]
    assert report.gate("stale_generation_commits").detail == (
        f"receipt {stale.pk} cycle {cycle.cycle_id} expected {cycle.generation - 2} committed {cycle.generation + 1} "
        "(committed generation is not the expected one + 1)",)


def test_snapshot_generation_behind_issue_order_fails_stale_generation(scenario):
    """A stale writer issues generation g+1 after g+2 was already issued."""
    sub = Subscription.objects.get(pk=scenario.grace.subscription_id)
    newest = EntitlementSnapshot.objects.filter(subscription=sub).latest("generation")
    gen, t = newest.generation, newest.issued_at
    for generation, issued_at in ((gen + 2, t + timedelta(minutes=1)), (gen + 1, t + timedelta(minutes=2))):
        EntitlementSnapshot.objects.create(subscription=sub, generation=generation, profile=newest.profile,
                                           capabilities=newest.capabilities, reason="writer", issued_at=issued_at)
    Subscription.objects.filter(pk=sub.pk).update(entitlement_generation=gen + 2)
    report = gates_evaluate()
    assert [g.key for g in report.failed] == ["stale_generation_commits"]
    assert report.gate("stale_generation_commits").detail == (
        f"{sub.provider_subscription_id}@{gen + 1} (snapshot generation not above the previously issued one)",)


def test_stored_generation_behind_newest_snapshot_fails_stale_generation(scenario):
    sub = Subscription.objects.get(pk=scenario.grace.subscription_id)
    Subscription.objects.filter(pk=sub.pk).update(entitlement_generation=sub.entitlement_generation - 1)
    report = gates_evaluate()
    assert [g.key for g in report.failed] == ["stale_generation_commits"]
    assert "stored generation below the newest snapshot" in report.gate("stale_generation_commits").detail[0]


def test_new_local_attempt_while_one_is_unknown_fails_blind_retries(scenario):
    cycle = scenario.unknown
    first = PaymentAttempt.objects.get(cycle=cycle, origin="LOCAL")
    assert first.state == "UNKNOWN"
    blind = PaymentAttempt.objects.create(
        cycle=cycle, origin=AttemptOrigin.LOCAL, idempotency_key=f"dunning-{cycle.cycle_id}-attempt-3",
        invoice_digest=first.invoice_digest, amount=first.amount, currency=first.currency, created_at=trusted_now(),
    )
    report = gates_evaluate()
    assert [g.key for g in report.failed] == ["blind_retries"]
    gate = report.gate("blind_retries")
    assert (gate.figure, gate.sample_size) == (1, 2)
    assert gate.detail[0].startswith(f"attempt {blind.operation_id}")


def test_second_key_for_the_same_attempt_slot_fails_blind_retries(scenario):
    cycle = scenario.unknown
    first = PaymentAttempt.objects.get(cycle=cycle, origin="LOCAL")
    later = first.created_at + timedelta(days=2)  # well after any resolution, so only the slot rule applies
    PaymentAttempt.objects.filter(pk=first.pk).update(state="FAILED", resolved_at=first.created_at)
    PaymentAttempt.objects.create(
        cycle=cycle, origin=AttemptOrigin.LOCAL, idempotency_key=f"retry-{cycle.cycle_id}-attempt-2-again",
        invoice_digest=first.invoice_digest, amount=first.amount, currency=first.currency, created_at=later,
    )
    PaymentAttempt.objects.create(
        cycle=cycle, origin=AttemptOrigin.LOCAL, idempotency_key=f"dunning-{cycle.cycle_id}-attempt-02",
        invoice_digest=first.invoice_digest, amount=first.amount, currency=first.currency, created_at=later,
    )
    gate = gates_evaluate().gate("blind_retries")
    assert not gate.passed and gate.figure == 2
    assert any("not a slot key" in d for d in gate.detail) and any("slot 2" in d for d in gate.detail)


def test_slow_recovery_fails_p99(scenario):
    cycle = scenario.paid_of_two
    recovered = TransitionReceipt.objects.get(cycle=cycle, accepted=True, edge="recover")
    event = _inbox("invoice.paid", {"id": cycle.invoice.provider_invoice_id},
                   received_at=recovered.trusted_time - timedelta(minutes=5))
    ProviderEvent.objects.filter(pk=event.pk).update(outcome=EventOutcome.NO_CHANGE, processed_at=trusted_now(),
                                                     subscription=cycle.subscription_id, invoice=cycle.invoice_id)
    report = gates_evaluate()
    assert [g.key for g in report.failed] == ["payment_to_recovery_p99"]
    gate = report.gate("payment_to_recovery_p99")
    assert gate.figure >= 300
    assert gate.detail[0].startswith(f"cycle {cycle.cycle_id}")


def test_paid_but_never_restored_fails_p99(scenario):
    """A broken build recovers the last debt but never issues FULL: the latency runs until now."""
    cycle, sub = scenario.grace, scenario.grace.subscription
    now = trusted_now()
    MonetaryFact.objects.create(kind=FactKind.PAYMENT_SUCCEEDED, invoice=cycle.invoice, cycle=cycle,
                                amount=cycle.amount, currency=cycle.currency, provider_ref="pi_paid",
                                dedupe_key=f"paid:{cycle.invoice.provider_invoice_id}",
                                occurred_at=now - timedelta(minutes=3), recorded_at=now - timedelta(minutes=3))
    TransitionReceipt.objects.create(
        subscription=sub, cycle=cycle, edge="recover", accepted=True, from_state="GRACE_ACTIVE",
        to_state="RECOVERED", cause_kind=CauseKind.EVENT, actor="webhook", root_before=sub.outstanding_cycle_root,
        root_after=EMPTY_ROOT, decision_profile="FULL", entitlement_generation=sub.entitlement_generation,
        policy=cycle.policy, trusted_time=now - timedelta(minutes=3),
    )
    gate = gates_evaluate(now=now).gate("payment_to_recovery_p99")
    assert not gate.passed and gate.figure >= 180
    assert gate.detail == (f"cycle {cycle.cycle_id} ({gate.figure:.1f}s, access not restored)",)
