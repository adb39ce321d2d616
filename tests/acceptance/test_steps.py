"""Several edges of one cycle in one acceptance (`cycle_accept_steps`): one transaction, and the
receipts, snapshots and outbox rows of the same edges asked for one call at a time."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from dunning.acceptance.inputs import Cause, Expect, StepRequest
from dunning.acceptance.transitions import cycle_accept_steps
from dunning.models import DunningCycle, OutboxMessage, TransitionReceipt
from entitlements.models import EntitlementSnapshot
from tests.support.builders import accept, clock_reaches, make_subscription, open_cycle, reload, unpaid_evidence
from tests.support.paths import Walker

RESTRICT = ("expire_grace", "begin_restriction", "complete_restriction")


@pytest.fixture
def twins(policy):
    """Two subscriptions, each with one cycle in grace since the same moment."""
    walkers = [Walker(open_cycle(make_subscription())).to_grace() for _ in range(2)]
    return [reload(w.cycle) for w in walkers]


def _steps(cycle: DunningCycle, now: Any, *, begin_status: str = "open") -> list[StepRequest]:
    evidence = unpaid_evidence(cycle, now=now, status=begin_status)
    return [StepRequest("expire_grace"), StepRequest("begin_restriction", evidence=evidence),
            StepRequest("complete_restriction")]


def _one_at_a_time(cycle: DunningCycle, steps: list[StepRequest], now: Any) -> list[Any]:
    """The reference: each step its own call, on the cycle as the step before left it."""
    results = []
    for step in steps:
        result = accept(cycle, step.edge, evidence=step.evidence, now=now, cause=Cause.system("test"))
        results.append(result)
        if not result.accepted:
            break
    return results


def _in_one_call(cycle: DunningCycle, steps: list[StepRequest], now: Any, expect: Expect | None = None) -> list[Any]:
    with clock_reaches(now):
        return cycle_accept_steps(cycle_pk=cycle.pk, steps=steps, expect=expect or Expect.from_cycle(reload(cycle)),
                                  cause=Cause.system("test"), now=now)


class _Names:
    """Names each cycle's own identifiers (roots, ids) by order of first appearance, so two twins'
    rows compare equal exactly when they match field by field up to those identifiers."""

    def __init__(self, cycle: DunningCycle) -> None:
        sub = cycle.subscription
        self.known = {str(cycle.cycle_id): "<cycle>", str(cycle.pk): "<cycle pk>", str(sub.pk): "<sub>",
                      sub.provider_subscription_id: "<psub>", cycle.invoice.provider_invoice_id: "<invoice>"}

    def __call__(self, value: Any, key: str = "") -> Any:
        if isinstance(value, dict):
            return {k: self(v, k) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self(v) for v in value]
        if isinstance(value, int) and key == "subscription":
            return self.known[str(value)]
        if not isinstance(value, str) or not value:
            return value
        if value not in self.known and len(value) >= 32 and " " not in value:  # a root
            self.known[value] = f"<root {len([k for k in self.known.values() if k.startswith('<root')])}>"
        if ":" in value:  # a dedupe key: <topic>:<subscription pk>:<generation>, <topic>:<cycle id>:…
            parts = value.split(":")
            return ":".join(self.known.get(p, p) if i == 1 or not p.isdigit() else p for i, p in enumerate(parts))
        for raw, name in sorted(self.known.items(), key=lambda item: -len(item[0])):
            value = value.replace(raw, name) if len(raw) > 3 else value
        return value


RECEIPT_FIELDS = ("edge", "accepted", "from_state", "to_state", "rejection_reason", "detail", "cause_kind",
                  "cause_ref", "actor", "expected", "observed", "cycle_generation", "root_before", "root_after",
                  "decision_profile", "entitlement_generation", "policy_id", "trusted_time")


def _written(cycle: DunningCycle, since: int) -> dict[str, list]:
    names = _Names(reload(cycle))
    receipts = TransitionReceipt.objects.filter(cycle=cycle, pk__gt=since).order_by("pk")
    return {
        "receipts": [[names(getattr(r, f)) for f in RECEIPT_FIELDS]
                     + [r.evidence_receipt.status if r.evidence_receipt else None] for r in receipts],
        "snapshots": [[s.generation, s.profile, s.capabilities, s.reason, s.issued_at]
                      for s in EntitlementSnapshot.objects.filter(cause_receipt__in=receipts).order_by("pk")],
        "outbox": [[m.topic, names(m.dedupe_key), names(m.payload), m.created_at]
                   for m in OutboxMessage.objects.filter(receipt__in=receipts).order_by("pk")],
    }


def _last_receipt() -> int:
    return TransitionReceipt.objects.order_by("-pk").values_list("pk", flat=True).first() or 0


def _result_fields(result: Any) -> list:
    return [result.accepted, result.edge, result.reason, result.from_state, result.to_state, result.cycle_generation,
            result.profile, result.entitlement_generation, result.snapshot_issued, result.facts_recorded]


def test_three_steps_in_one_transaction_write_what_three_calls_write(twins):
    ours, theirs = twins
    now = ours.grace_expires_at + timedelta(seconds=1)
    since = _last_receipt()
    with CaptureQueriesContext(connection) as one_call:
        results = _in_one_call(ours, _steps(ours, now), now)
    with CaptureQueriesContext(connection) as three_calls:
        reference = _one_at_a_time(theirs, _steps(theirs, now), now)
    assert [r.edge for r in results if r.accepted] == list(RESTRICT)
    assert [_result_fields(r) for r in results] == [_result_fields(r) for r in reference]
    assert results[-1].cycle.state == reload(ours).state == "RESTRICTED"
    assert results[0].cycle is None and results[1].cycle is None
    assert {r.receipt_id for r in results} == set(TransitionReceipt.objects.filter(
        cycle=ours, pk__gt=since).values_list("pk", flat=True))
    mine, reference_rows = _written(ours, since), _written(theirs, since)
    assert mine == reference_rows
    assert [r[0] for r in mine["receipts"]] == list(RESTRICT)
    assert len(mine["snapshots"]) == 1 and mine["snapshots"][0][1] == "SUSPENDED"  # only RESTRICTED changes it
    assert len(mine["outbox"]) >= 2  # the entitlement change and the access_restricted notice

    def locks(queries: CaptureQueriesContext) -> int:
        return sum("FOR UPDATE OF" in q["sql"] for q in queries.captured_queries)

    def savepoints(queries: CaptureQueriesContext) -> int:
        return sum(q["sql"].startswith("SAVEPOINT") for q in queries.captured_queries)

    assert (locks(one_call), savepoints(one_call)) == (1, 1)  # one lock, one (test-wrapped) transaction
    assert (locks(three_calls), savepoints(three_calls)) == (3, 3)
    assert len(one_call.captured_queries) < len(three_calls.captured_queries)


def test_a_refusal_at_step_two_keeps_step_one_and_records_the_refusal(twins):
    ours, theirs = twins
    now = ours.grace_expires_at + timedelta(seconds=1)
    since = _last_receipt()
    results = _in_one_call(ours, _steps(ours, now, begin_status="paid"), now)
    reference = _one_at_a_time(theirs, _steps(theirs, now, begin_status="paid"), now)
    assert [(r.edge, r.accepted, r.reason) for r in results] == [
        ("expire_grace", True, ""), ("begin_restriction", False, "INVOICE_NOT_UNPAID")]  # step 3 not tried
    assert [_result_fields(r) for r in results] == [_result_fields(r) for r in reference]
    assert results[0].cycle.state == reload(ours).state == "GRACE_EXPIRED"  # as the accepted step left it
    rejection = TransitionReceipt.objects.get(pk=results[1].receipt_id)
    assert (rejection.accepted, rejection.from_state, rejection.cycle_generation) == (
        False, "GRACE_EXPIRED", results[0].cycle_generation)
    mine, reference_rows = _written(ours, since), _written(theirs, since)
    for a, b in zip(mine["receipts"], reference_rows["receipts"], strict=True):
        assert [(f, x) for f, x, y in zip(RECEIPT_FIELDS, a, b, strict=False) if x != y] == [], (a, b)
    assert mine == reference_rows


def test_a_refusal_at_the_last_step_keeps_the_steps_before(twins):
    ours, _ = twins
    now = ours.grace_expires_at + timedelta(seconds=1)
    steps = [*_steps(ours, now), StepRequest("complete_restriction")]  # not an edge from RESTRICTED
    results = _in_one_call(ours, steps, now)
    assert [(r.edge, r.accepted, r.reason) for r in results] == [
        *((edge, True, "") for edge in RESTRICT), ("complete_restriction", False, "EDGE_NOT_ALLOWED")]
    assert results[2].cycle.state == reload(ours).state == "RESTRICTED"


def test_a_compare_and_set_miss_refuses_the_first_step_and_takes_none(twins):
    ours, theirs = twins
    now = ours.grace_expires_at + timedelta(seconds=1)
    stale = Expect.from_cycle(reload(ours))
    accept(ours, "schedule_retry", now=now, next_attempt_at=now + timedelta(hours=1))  # moves the generation
    since = _last_receipt()
    results = _in_one_call(ours, _steps(ours, now), now, expect=stale)
    assert [(r.edge, r.accepted, r.reason) for r in results] == [("expire_grace", False, "STALE_CYCLE_GENERATION")]
    rows = _written(ours, since)
    assert [r[:2] for r in rows["receipts"]] == [["expire_grace", False]]
    assert rows["receipts"][0][RECEIPT_FIELDS.index("expected")]["cycle_generation"] == stale.cycle_generation
    assert reload(ours).state == "RETRY_SCHEDULED" and rows["snapshots"] == rows["outbox"] == []


def test_one_step_is_the_single_call(twins):
    ours, _ = twins
    now = ours.grace_expires_at + timedelta(seconds=1)
    [result] = _in_one_call(ours, [StepRequest("expire_grace")], now)
    assert result.accepted and result.cycle.state == "GRACE_EXPIRED"
    with pytest.raises(ValueError, match="unknown edge"):
        _in_one_call(ours, [StepRequest("complete_restriction"), StepRequest("no_such_edge")], now)
    with pytest.raises(ValueError, match="no steps"):
        _in_one_call(ours, [], now)
    assert reload(ours).state == "GRACE_EXPIRED"


def test_the_orm_read_of_the_demo_takes_the_same_steps(twins, monkeypatch):
    """On SQLite (the demo) `lock_and_read` takes the ORM's reads and leaves the other cycles to
    settlement: the steps still write what the PostgreSQL read writes."""
    ours, theirs = twins
    now = ours.grace_expires_at + timedelta(seconds=1)
    since = _last_receipt()
    with monkeypatch.context() as patched:
        patched.setattr(connections["default"], "vendor", "sqlite")
        results = _in_one_call(ours, _steps(ours, now), now)
    reference = _in_one_call(theirs, _steps(theirs, now), now)
    assert [_result_fields(r) for r in results] == [_result_fields(r) for r in reference]
    assert _written(ours, since) == _written(theirs, since)
