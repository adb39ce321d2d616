"""The acceptance transaction's own reads (dunning.acceptance.locked_read): few statements, and
the other cycles read only once the subscription lock is held."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.db.models import F
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from dunning.acceptance.aggregate import outstanding_root
from dunning.acceptance.guards import active_incident
from dunning.acceptance.inputs import Cause, Expect
from dunning.acceptance.locked_read import lock_and_read
from dunning.acceptance.settlement import compute_aggregate, cycle_view
from dunning.acceptance.transitions import cycle_accept_transition
from dunning.clock import database_now
from dunning.models import DunningCycle, IncidentSwitch, RolloutStage, TransitionReceipt
from dunning.policy.cache import policy_spec
from dunning.policy.rollout import effective_stage
from subscriptions.models import Subscription
from tests.support.builders import accept, make_policy, make_subscription, open_cycle, reload, unpaid_evidence
from tests.support.paths import Walker


@pytest.fixture
def two_in_grace(policy):
    sub = make_subscription()
    a = Walker(open_cycle(sub)).to_grace()
    b = Walker(open_cycle(sub))
    b.now = a.now
    b.to_grace()
    return sub, reload(a.cycle), reload(b.cycle)


def test_an_acceptance_is_five_statements(two_in_grace, django_assert_max_num_queries):
    """Savepoint (BEGIN outside a test), the lock, the decision's read, the receipt, release
    (COMMIT): the ORM's reads took seven."""
    _, cycle, _ = two_in_grace
    expect = Expect.from_cycle(cycle)
    with django_assert_max_num_queries(5):
        result = cycle_accept_transition(cycle_pk=cycle.pk, edge="record_evidence", expect=expect,
                                         cause=Cause.system("test"))
    assert result.accepted


def test_the_read_holds_what_the_orm_would_read(two_in_grace):
    sub, cycle, other = two_in_grace
    stage = RolloutStage.objects.create(
        policy=sub.policy, cohort="*", mode="NOTIFY_ONLY", percent=50, previous_mode="ENFORCE", previous_percent=100,
        started_at=other.grace_started_at, reason="test", ticket="T-1")
    with transaction.atomic():
        read = lock_and_read(cycle.pk)
    stored = reload(cycle)
    assert [getattr(read.cycle, f.attname) for f in DunningCycle._meta.concrete_fields] == [
        getattr(stored, f.attname) for f in DunningCycle._meta.concrete_fields]
    assert read.cycle.invoice.price_ids == stored.invoice.price_ids  # through the JSON field's converter
    assert read.cycle.invoice.revision == stored.invoice.revision
    assert read.subscription.outstanding_cycle_root == Subscription.objects.get(pk=sub.pk).outstanding_cycle_root
    assert read.cycle.subscription is read.subscription
    assert (read.cycle.policy.pk, read.cycle.policy.digest) == (stored.policy.pk, stored.policy.digest)
    assert read.others == (cycle_view(reload(other)),)
    assert read.stage == effective_stage(policy_spec(stored.subscription.policy), sub.cohort)
    assert read.stage.stage_id == stage.pk


def test_a_missing_cycle_is_does_not_exist(policy):
    with transaction.atomic(), pytest.raises(DunningCycle.DoesNotExist):
        lock_and_read(987654)


@pytest.mark.django_db(transaction=True)
@pytest.mark.race
def test_other_cycles_are_read_after_the_subscription_lock_is_held():
    """An acceptance that waits for the subscription lock must see what the holder changed in the
    subscription's other cycles: read in the locking statement, they would come from the snapshot
    taken before the wait, and the root would still count a cycle the holder settled."""
    make_policy()
    sub = make_subscription()
    a = Walker(open_cycle(sub)).to_grace()
    b = Walker(open_cycle(sub))
    b.now = a.now
    b.to_grace()
    settled_a, cycle_b = reload(a.cycle), reload(b.cycle)
    only_b = outstanding_root([cycle_view(cycle_b)])
    held, release = threading.Event(), threading.Event()

    def holder() -> None:  # stands in for an acceptance settling cycle A
        try:
            with transaction.atomic():
                Subscription.objects.select_for_update().get(pk=sub.pk)
                held.set()
                release.wait(30)
                DunningCycle.objects.filter(pk=settled_a.pk).update(state="RECOVERED", generation=F("generation") + 1)
                Subscription.objects.filter(pk=sub.pk).update(outstanding_cycle_root=only_b)
        finally:
            connections.close_all()

    outcome: list = []

    def waiter() -> None:
        try:
            expect = Expect.from_cycle(cycle_b)
            outcome.append(cycle_accept_transition(cycle_pk=cycle_b.pk, edge="record_evidence",
                                                   expect=Expect(expect.cycle_generation, expect.invoice_revision,
                                                                 expect.attempt_id, expect.policy_id, only_b),
                                                   cause=Cause.system("test")))
        finally:
            connections.close_all()

    first = threading.Thread(target=holder, daemon=True)
    first.start()
    assert held.wait(30)
    second = threading.Thread(target=waiter, daemon=True)
    second.start()
    with connection.cursor() as cursor:  # until the acceptance waits for the holder's lock
        for _ in range(3000):
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                           "AND datname = current_database()")
            if cursor.fetchone()[0]:
                break
            time.sleep(0.01)
        else:
            pytest.fail("the acceptance never waited for the subscription lock")
    release.set()
    first.join(30)
    second.join(30)
    [result] = outcome
    assert result.accepted, result
    assert TransitionReceipt.objects.get(pk=result.receipt_id).root_after == only_b
    sub = Subscription.objects.get(pk=sub.pk)
    assert sub.outstanding_cycle_root == only_b == compute_aggregate(sub, None)[0]


def test_the_orm_path_for_the_embedded_database_reads_the_same_rows(two_in_grace, monkeypatch):
    """SQLite (the demo) has no FOR UPDATE OF, LATERAL or pipeline: lock_and_read takes the ORM's
    reads there and leaves the other cycles and the stage to settlement."""
    sub, cycle, _ = two_in_grace
    with transaction.atomic():
        sql = lock_and_read(cycle.pk)
    monkeypatch.setattr(connections["default"], "vendor", "sqlite")
    with transaction.atomic():
        orm = lock_and_read(cycle.pk)
    monkeypatch.undo()
    assert orm.others is None and orm.stage is None
    assert not orm.incident_read and orm.database_clock is None  # the guards read them themselves
    assert [getattr(orm.cycle, f.attname) for f in DunningCycle._meta.concrete_fields] == [
        getattr(sql.cycle, f.attname) for f in DunningCycle._meta.concrete_fields]
    assert orm.cycle.invoice.revision == sql.cycle.invoice.revision
    assert orm.subscription.pk == sub.pk and orm.cycle.subscription is orm.subscription
    with monkeypatch.context() as patched, pytest.raises(DunningCycle.DoesNotExist):
        patched.setattr(connections["default"], "vendor", "sqlite")
        with transaction.atomic():
            lock_and_read(cycle.pk + 10_000)


def _values(obj: object) -> dict | None:
    return None if obj is None else {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}


def test_the_read_carries_the_database_clock_and_the_incident_the_guard_would_read(two_in_grace):
    """The decision's statement also brings PostgreSQL's clock (read once the locks are held) and
    the incident pausing restrictions for the subscription's cohort: what `active_incident` finds."""
    sub, cycle, _ = two_in_grace
    with transaction.atomic():
        before = database_now()
        read = lock_and_read(cycle.pk)
        after = database_now()
    assert read.incident_read and read.incident is None and before <= read.database_clock <= after
    now = timezone.now()
    for cohort, minutes, ended in (("*", 50, now), (sub.cohort, 30, None), ("*", 20, None), ("other", 40, None)):
        IncidentSwitch.objects.create(cohort=cohort, reason="r", ticket=f"INC-{cohort}-{minutes}", ended_at=ended,
                                      started_at=now - timedelta(minutes=minutes))
    with transaction.atomic():
        read = lock_and_read(cycle.pk)
    assert read.incident.ticket == f"INC-{sub.cohort}-30"
    assert _values(read.incident) == _values(active_incident(sub.cohort))


def test_a_restriction_asks_neither_the_clock_nor_the_incident_in_a_statement_of_its_own(policy, settings):
    settings.DUNNING_CLOCK_OVERRIDE = "DATABASE"  # PostgreSQL's clock for every time guard
    walker = Walker(open_cycle(make_subscription()), now=database_now() - timedelta(days=60)).to_grace()
    walker.now = reload(walker.cycle).grace_expires_at + timedelta(seconds=1)
    with CaptureQueriesContext(connection) as queries:
        walker.step("expire_grace")
        walker.step("begin_restriction", evidence=unpaid_evidence(walker.cycle, now=walker.now))
    asked = [q["sql"] for q in queries.captured_queries if "clock_timestamp()" in q["sql"]
             or "dunning_incidentswitch" in q["sql"]]
    assert len(asked) == 2 and all("dunning_rolloutstage" in sql for sql in asked)  # the two decision reads


def test_a_refusal_for_an_incident_comes_from_the_read(two_in_grace):
    sub, cycle, _ = two_in_grace
    IncidentSwitch.objects.create(cohort="*", reason="bad deploy", ticket="INC-9",
                                  started_at=timezone.now() - timedelta(minutes=1))
    walker = Walker(cycle)
    walker.now = cycle.grace_expires_at + timedelta(seconds=1)
    walker.step("expire_grace")
    result = accept(walker.cycle, "begin_restriction", now=walker.now,
                    evidence=unpaid_evidence(walker.cycle, now=walker.now))
    assert not result.accepted and result.reason == "RESTRICTIONS_PAUSED" and "INC-9" in result.detail
