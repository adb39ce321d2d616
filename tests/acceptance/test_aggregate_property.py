"""Hypothesis stateful test: random invoice outcomes against a small reference model of the
outstanding root and the aggregate decision (SPEC §7).

pytest-django does not roll back between Hypothesis examples, so each example runs inside
its own atomic block marked as a test-case block (as Django's TestCase does) and rolled back.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.db import transaction
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from dunning.acceptance.aggregate import EMPTY_ROOT
from dunning.acceptance.inputs import Evidence, InvoiceUpdate
from dunning.acceptance.settlement import compute_aggregate, subscription_views
from entitlements.models import EntitlementSnapshot
from subscriptions.models import Subscription
from tests.support.builders import accept, invoice_receipt, make_policy, make_subscription, open_cycle, reload

RANK = {"FULL": 0, "READ_EXPORT_NO_NEW_JOBS": 1, "SUSPENDED": 2}


def evidence(cycle, status: str, now: datetime) -> Evidence:
    inv = cycle.invoice
    return Evidence(
        receipt=invoice_receipt(cycle, status, fetched_at=now),
        invoice=InvoiceUpdate(status=status, amount_due=inv.amount_due,
                              amount_paid=inv.amount_due if status == "paid" else 0,
                              attempt_count=inv.attempt_count, next_payment_attempt=None),
    )


class DebtMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._atomic = transaction.atomic()
        self._atomic._from_testcase = True  # lets the durable acceptance blocks nest, as in TestCase
        self._atomic.__enter__()
        make_policy()
        self.sub = make_subscription()
        self.now = datetime(2027, 1, 1, tzinfo=UTC)
        self.cycles: list = []
        self.model: list[dict[str, str]] = []  # reference: {"state": ..., "status": ...}
        self.model_generation = 1
        self.model_profile = "FULL"

    def teardown(self) -> None:
        transaction.set_rollback(True)
        self._atomic.__exit__(None, None, None)

    # ---- reference model
    def reference_blocking(self) -> set[int]:
        return {i for i, c in enumerate(self.model)
                if c["state"] in ("GRACE", "RESTRICTED") and c["status"] in ("open", "uncollectible")}

    def reference_profile(self) -> str:
        blocking = self.reference_blocking()
        if any(self.model[i]["state"] == "RESTRICTED" for i in blocking):
            return "SUSPENDED"
        return "READ_EXPORT_NO_NEW_JOBS" if blocking else "FULL"

    def settle_reference(self) -> None:
        profile = self.reference_profile()
        if profile != self.model_profile:
            self.model_profile = profile
            self.model_generation += 1

    def pick(self, index: int, states: tuple[str, ...]) -> int | None:
        candidates = [i for i, c in enumerate(self.model) if c["state"] in states]
        return candidates[index % len(candidates)] if candidates else None

    # ---- rules
    @precondition(lambda self: len(self.cycles) < 4)
    @rule()
    def open_invoice(self) -> None:
        self.cycles.append(open_cycle(self.sub, now=self.now))
        self.model.append({"state": "CURRENT", "status": "open"})

    @rule(i=st.integers(0, 3), code=st.sampled_from(["insufficient_funds", "stolen_card", "expired_card"]))
    def payment_fails(self, i: int, code: str) -> None:
        idx = self.pick(i, ("CURRENT",))
        if idx is None:
            return
        self.now += timedelta(minutes=5)
        assert accept(self.cycles[idx], "record_failure", decline_code=code, now=self.now)
        assert accept(self.cycles[idx], "start_grace", now=self.now)
        self.model[idx]["state"] = "GRACE"
        self.settle_reference()

    @rule(i=st.integers(0, 3))
    def invoice_paid(self, i: int) -> None:
        idx = self.pick(i, ("CURRENT", "GRACE", "RESTRICTED"))
        if idx is None:
            return
        self.now += timedelta(minutes=1)
        cycle = reload(self.cycles[idx])
        assert accept(cycle, "recover", evidence=evidence(cycle, "paid", self.now), now=self.now)
        self.model[idx] = {"state": "RECOVERED", "status": "paid"}
        self.settle_reference()

    @rule(i=st.integers(0, 3))
    def invoice_voided(self, i: int) -> None:
        idx = self.pick(i, ("CURRENT", "GRACE", "RESTRICTED"))
        if idx is None:
            return
        self.now += timedelta(minutes=1)
        cycle = reload(self.cycles[idx])
        assert accept(cycle, "close_void", evidence=evidence(cycle, "void", self.now), now=self.now)
        self.model[idx] = {"state": "VOID", "status": "void"}
        self.settle_reference()

    @rule(i=st.integers(0, 3))
    def marked_uncollectible(self, i: int) -> None:
        idx = self.pick(i, ("GRACE", "RESTRICTED"))
        if idx is None:
            return
        cycle = reload(self.cycles[idx])
        assert accept(cycle, "record_evidence", evidence=evidence(cycle, "uncollectible", self.now), now=self.now)
        self.model[idx]["status"] = "uncollectible"
        self.settle_reference()

    @rule(i=st.integers(0, 3))
    def grace_runs_out(self, i: int) -> None:
        idx = self.pick(i, ("GRACE",))
        if idx is None:
            return
        cycle = reload(self.cycles[idx])
        self.now = max(self.now, cycle.grace_expires_at + timedelta(seconds=1))
        status = self.model[idx]["status"]
        assert accept(cycle, "expire_grace", now=self.now)
        assert accept(cycle, "begin_restriction", evidence=evidence(reload(cycle), status, self.now), now=self.now)
        assert accept(cycle, "complete_restriction", now=self.now)
        self.model[idx]["state"] = "RESTRICTED"
        self.settle_reference()

    @rule(i=st.integers(0, 3))
    def late_failure_after_payment(self, i: int) -> None:
        idx = self.pick(i, ("RECOVERED", "VOID"))
        if idx is None:
            return
        result = accept(self.cycles[idx], "record_failure", decline_code="insufficient_funds", now=self.now)
        assert not result.accepted and result.reason == "EDGE_NOT_ALLOWED"

    # ---- invariants
    @invariant()
    def root_and_decision_match_reference(self) -> None:
        sub = Subscription.objects.get(pk=self.sub.pk)
        root, decision = compute_aggregate(sub, None)
        assert sub.outstanding_cycle_root == root, "stored root differs from a recomputation"
        views = subscription_views(sub, None)
        from dunning.acceptance.aggregate import is_blocking

        db_blocking = {v.cycle_id for v in views if is_blocking(v)}
        ref_blocking = {str(self.cycles[i].cycle_id) for i in self.reference_blocking()}
        assert db_blocking == ref_blocking
        assert (root == EMPTY_ROOT) == (not ref_blocking)
        assert sub.entitlement_profile == self.reference_profile() == decision.profile
        assert sub.entitlement_generation == self.model_generation
        latest = EntitlementSnapshot.objects.filter(subscription=sub).latest()
        assert (latest.generation, latest.profile) == (sub.entitlement_generation, sub.entitlement_profile)


def test_root_and_decision_follow_the_reference_model(db):
    run_state_machine_as_test(
        DebtMachine,
        settings=settings(max_examples=25, stateful_step_count=15, deadline=None,
                          suppress_health_check=list(HealthCheck)),
    )
