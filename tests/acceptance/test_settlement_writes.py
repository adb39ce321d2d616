"""The writes that end an acceptance (dunning.acceptance.settlement_writes): one statement on
PostgreSQL, the same rows (and history rows) as the ORM writes for the embedded SQLite demo."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from dunning.acceptance.inputs import Cause
from dunning.acceptance.settlement_writes import SettlementWrites, settlement_write
from dunning.models import OutboxMessage, TransitionReceipt
from entitlements.models import EntitlementSnapshot
from subscriptions.models import Subscription
from tests.support.builders import make_subscription

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def _writes(sub: Subscription, user: Any, *, outbox_rows: int = 2, change: bool = True) -> SettlementWrites:
    cause = Cause.system("test")
    receipt = TransitionReceipt(
        subscription=sub, edge="recover", accepted=True, from_state="GRACE_ACTIVE", to_state="RECOVERED",
        detail="paid", cause_kind=cause.kind, cause_ref=cause.ref, actor=cause.actor, actor_user=user,
        expected={"root": "a"}, observed={}, cycle_generation=4, root_before="a", root_after="",
        decision_profile="FULL", entitlement_generation=sub.entitlement_generation + 1, policy_id=sub.policy_id,
        trusted_time=NOW)
    snapshot = EntitlementSnapshot(subscription=sub, generation=sub.entitlement_generation + 1, profile="FULL",
                                   capabilities={"read": True, "limits": {}}, reason="paid", issued_at=NOW,
                                   cause_receipt=receipt)
    outbox = [OutboxMessage(topic=f"topic.{i}", dedupe_key=f"key:{sub.pk}:{i}", payload={"n": i, "sub": sub.pk},
                            subscription=sub, receipt=receipt, created_at=NOW) for i in range(outbox_rows)]
    fields: tuple[str, ...] = ()
    if change:
        sub.outstanding_cycle_root = ""
        sub.entitlement_profile = "FULL"
        sub.entitlement_generation += 1
        sub.row_version += 1
        sub._history_user = user  # as the history middleware would name a staff member
        fields = ("outstanding_cycle_root", "row_version", "updated_at", "entitlement_profile",
                  "entitlement_generation")
    return SettlementWrites(receipt=receipt, snapshot=snapshot if change else None, subscription=sub,
                            update_fields=fields, outbox=outbox)


def _rows(writes: SettlementWrites) -> dict[str, Any]:
    """What was stored, without what differs between two subscriptions (ids, their own keys, clocks)."""
    receipt = TransitionReceipt.objects.get(pk=writes.receipt.pk)
    sub = Subscription.objects.get(pk=writes.subscription.pk)
    skip = {"id", "subscription_id", "recorded_at", "receipt_id", "cause_receipt_id", "dedupe_key", "payload"}

    def plain(obj: Any) -> dict[str, Any]:
        return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields if f.attname not in skip}

    snapshots = list(EntitlementSnapshot.objects.filter(cause_receipt=receipt))
    outbox = list(OutboxMessage.objects.filter(receipt=receipt).order_by("topic"))
    sub_history = list(sub.history.filter(history_date__gte=receipt.recorded_at).values(
        "history_type", "history_change_reason", "history_user_id", "outstanding_cycle_root", "entitlement_profile",
        "entitlement_generation", "row_version", "updated_at"))
    outbox_history = [list(m.history.values("history_type", "history_change_reason", "history_user_id", "topic",
                                            "receipt_id", "payload", "created_at")) for m in outbox]
    for message, history in zip(outbox, outbox_history, strict=True):  # each history row is its row's
        assert history == [{"history_type": "+", "history_change_reason": None, "history_user_id": None,
                            "topic": message.topic, "receipt_id": receipt.pk, "payload": message.payload,
                            "created_at": message.created_at}]
    for history in sub_history:
        assert (history["row_version"], history["updated_at"]) == (sub.row_version, sub.updated_at)
    return {"receipt": plain(receipt), "snapshots": [plain(s) for s in snapshots],
            "snapshot_cites_receipt": [s.cause_receipt_id for s in snapshots] == (
                [receipt.pk] if writes.snapshot else []),
            "subscription": (sub.outstanding_cycle_root, sub.entitlement_profile, sub.entitlement_generation),
            "subscription_history": [{k: v for k, v in h.items() if k not in ("row_version", "updated_at")}
                                     for h in sub_history],
            "outbox": [plain(m) for m in outbox], "outbox_history": [len(h) for h in outbox_history]}


@pytest.mark.parametrize("change", [True, False])
def test_one_statement_writes_what_the_orm_writes(policy, staff, monkeypatch, change):
    sql_sub, orm_sub = make_subscription(), make_subscription()
    sql_writes, orm_writes = _writes(sql_sub, staff, change=change), _writes(orm_sub, staff, change=change)
    with CaptureQueriesContext(connection) as sql_queries:
        settlement_write(sql_writes)
    monkeypatch.setattr(connections["default"], "vendor", "sqlite")
    with CaptureQueriesContext(connection) as orm_queries:
        settlement_write(orm_writes)
    monkeypatch.undo()

    assert len(sql_queries.captured_queries) == 1
    # The fallback took the ORM's statements: receipt, snapshot, subscription and its history row,
    # outbox rows and theirs (the last two one INSERT each).
    assert len(orm_queries.captured_queries) == (6 if change else 3)
    assert all(w.receipt.pk and not w.receipt._state.adding for w in (sql_writes, orm_writes))
    assert all(m.pk and m.receipt_id == sql_writes.receipt.pk for m in sql_writes.outbox)
    if change:
        assert sql_writes.snapshot.pk and sql_writes.snapshot.cause_receipt_id == sql_writes.receipt.pk
    sql_rows, orm_rows = _rows(sql_writes), _rows(orm_writes)
    assert sql_rows == orm_rows
    assert sql_rows["snapshot_cites_receipt"]
    assert sql_rows["receipt"]["actor_user_id"] == staff.pk
    assert sql_rows["subscription_history"] == ([{
        "history_type": "~", "history_change_reason": None, "history_user_id": staff.pk,
        "outstanding_cycle_root": "", "entitlement_profile": "FULL",
        "entitlement_generation": sql_sub.entitlement_generation}] if change else [])
    assert sql_rows["outbox_history"] == [1, 1]


def test_a_receipt_alone_is_one_insert(policy, staff):
    writes = _writes(make_subscription(), staff, outbox_rows=0, change=False)
    with CaptureQueriesContext(connection) as queries:
        settlement_write(writes)
    [query] = queries.captured_queries
    assert query["sql"].startswith('WITH r AS (INSERT INTO "dunning_transitionreceipt"')
    assert TransitionReceipt.objects.get(pk=writes.receipt.pk).edge == "recover"


def test_without_history_the_orm_writes_none(policy, staff, settings):
    settings.SIMPLE_HISTORY_ENABLED = False
    writes = _writes(make_subscription(), staff)
    settlement_write(writes)
    assert [m.history.count() for m in writes.outbox] == [0, 0]
    assert OutboxMessage.objects.filter(receipt_id=writes.receipt.pk).count() == 2
