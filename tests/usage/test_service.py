"""`usage_record` on PostgreSQL: idempotent replay, a conflicting duplicate changes nothing, every
entitlement profile accepts usage, cycles and debt stay untouched, records are never deleted or
rewritten (model layer and database trigger), and invoicing happens once."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO
from zoneinfo import ZoneInfo

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

from dunning.append_only import AppendOnlyViolation
from dunning.clock import trusted_now
from dunning.models import DunningCycle, TransitionReceipt
from entitlements.api.tokens import service_token_create
from entitlements.profiles import PROFILES
from subscriptions.models import Invoice, Subscription, UsageRecord
from subscriptions.usage import (
    UsageConflict,
    UsageInvalid,
    UsageRefused,
    usage_digest,
    usage_mark_invoiced,
    usage_record,
)
from subscriptions.usage_reads import usage_totals
from tests.support.builders import fail_first_payment, make_subscription, open_cycle
from tests.usage.conftest import subscription_in_profile, usage

pytestmark = pytest.mark.django_db


def _debt_state(sub: Subscription) -> list[tuple]:
    cycles = [(c.pk, c.state, c.amount, c.currency, c.generation, c.retry_budget_used)
              for c in DunningCycle.objects.filter(subscription=sub).order_by("pk")]
    invoices = [(i.pk, i.amount_due, i.amount_paid, i.status, i.revision)
                for i in Invoice.objects.filter(subscription=sub).order_by("pk")]
    root = Subscription.objects.filter(pk=sub.pk).values_list(
        "outstanding_cycle_root", "entitlement_profile", "entitlement_generation", "row_version").get()
    return [cycles, invoices, root, TransitionReceipt.objects.filter(cycle__subscription=sub).count()]


def test_a_record_is_stored_with_its_digest_and_the_trusted_receipt_time(policy, producer):
    sub = make_subscription()
    now = trusted_now()
    outcome = usage_record(subscription=sub, producer=producer, usage=usage(currency="USD"), now=now)
    record = outcome.record
    assert outcome.created
    assert (record.metric, record.quantity, record.cost, record.currency) == ("tokens", 1200, 36, "usd")
    assert record.received_at == now and record.invoiced_at is None and record.provider_invoice_id == ""
    assert record.body_digest == usage_digest(sub.pk, usage(currency="usd", occurred_at=record.occurred_at))
    assert len(record.body_digest) == 64


def test_the_same_producer_id_and_body_replays_the_stored_record(policy, producer):
    sub = make_subscription()
    sent = usage()
    first = usage_record(subscription=sub, producer=producer, usage=sent)
    # The same record spelled differently (currency case, another UTC offset) is the same record.
    respelled = usage(currency="USD", occurred_at=sent.occurred_at.astimezone(ZoneInfo("Asia/Shanghai")))
    again = usage_record(subscription=sub, producer=producer, usage=respelled)
    assert not again.created and again.record.pk == first.record.pk
    assert UsageRecord.objects.count() == 1


@pytest.mark.parametrize("change", [{"quantity": 1201}, {"cost": 37}, {"metric": "calls"},
                                    {"occurred_at": trusted_now() - timedelta(hours=2)}])
def test_the_same_producer_id_with_another_body_is_refused_and_changes_nothing(policy, producer, change):
    sub = make_subscription()
    first = usage_record(subscription=sub, producer=producer, usage=usage()).record
    before = list(UsageRecord.objects.values())
    with pytest.raises(UsageConflict) as refused:
        usage_record(subscription=sub, producer=producer, usage=usage(**change))
    assert refused.value.existing.pk == first.pk
    assert list(UsageRecord.objects.values()) == before


def test_the_same_id_for_another_subscription_is_a_conflict_too(policy, producer):
    one, other = make_subscription(), make_subscription()
    usage_record(subscription=one, producer=producer, usage=usage())
    with pytest.raises(UsageConflict):
        usage_record(subscription=other, producer=producer, usage=usage())
    assert not UsageRecord.objects.filter(subscription=other).exists()


def test_two_producers_may_use_the_same_id(policy, producer):
    other, _ = service_token_create(name="other-meter", scopes=("usage:write",))
    sub = make_subscription()
    usage_record(subscription=sub, producer=producer, usage=usage())
    assert usage_record(subscription=sub, producer=other, usage=usage()).created
    assert UsageRecord.objects.filter(subscription=sub).count() == 2


@pytest.mark.parametrize("bad, field", [
    ({"quantity": 0}, "quantity"), ({"quantity": -3}, "quantity"), ({"cost": -1}, "cost"),
    ({"metric": "gigabytes"}, "metric"), ({"currency": "dollars"}, "currency"), ({"producer_record_id": ""},
                                                                                  "producer_record_id"),
    ({"occurred_at": trusted_now() + timedelta(days=1)}, "occurred_at"),
])
def test_malformed_records_are_refused_with_the_field_and_nothing_is_written(policy, producer, bad, field):
    sub = make_subscription()
    with pytest.raises(UsageInvalid) as refused:
        usage_record(subscription=sub, producer=producer, usage=usage(**bad))
    assert field in refused.value.errors
    assert not UsageRecord.objects.exists()


def test_cost_in_another_currency_than_the_subscriptions_is_refused(policy, producer):
    sub = make_subscription()
    open_cycle(sub, currency="eur")
    with pytest.raises(UsageInvalid) as refused:
        usage_record(subscription=sub, producer=producer, usage=usage(currency="usd"))
    assert "billed in eur" in refused.value.errors["currency"]
    assert usage_record(subscription=sub, producer=producer, usage=usage(currency="EUR")).created


def test_without_an_invoice_the_first_records_currency_holds(policy, producer):
    sub = make_subscription()
    usage_record(subscription=sub, producer=producer, usage=usage("a", currency="gbp"))
    with pytest.raises(UsageInvalid):
        usage_record(subscription=sub, producer=producer, usage=usage("b", currency="usd"))


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_usage_is_recorded_in_every_entitlement_profile(producer, profile):
    sub = subscription_in_profile(profile)
    assert usage_record(subscription=sub, producer=producer, usage=usage(f"in-{profile}")).created
    assert UsageRecord.objects.filter(subscription=sub).count() == 1


def test_recording_usage_never_touches_cycles_or_debt(policy, producer):
    sub = make_subscription()
    cycle = open_cycle(sub, amount=4900)
    fail_first_payment(cycle)
    before = _debt_state(sub)
    at = trusted_now() - timedelta(minutes=1)
    for n in range(3):
        usage_record(subscription=sub, producer=producer, usage=usage(f"r{n}", quantity=10_000, cost=500,
                                                                     occurred_at=at))
    usage_record(subscription=sub, producer=producer, usage=usage("r0", quantity=10_000, cost=500, occurred_at=at))
    assert _debt_state(sub) == before
    assert usage_totals(sub).cost == 1500


def test_a_record_is_never_deleted_or_rewritten(policy, producer):
    sub = make_subscription()
    record = usage_record(subscription=sub, producer=producer, usage=usage()).record
    with pytest.raises(AppendOnlyViolation):
        record.delete()
    with pytest.raises(AppendOnlyViolation):
        UsageRecord.objects.filter(pk=record.pk).delete()
    record.quantity = 1
    with pytest.raises(AppendOnlyViolation):
        record.save()
    with pytest.raises(AppendOnlyViolation):
        UsageRecord.objects.filter(pk=record.pk).update(cost=0)
    assert UsageRecord.objects.get(pk=record.pk).quantity == 1200


@pytest.mark.parametrize("sql", [
    "DELETE FROM subscriptions_usagerecord WHERE id = %s",
    "UPDATE subscriptions_usagerecord SET quantity = 1 WHERE id = %s",
    "UPDATE subscriptions_usagerecord SET cost = 0, invoiced_at = now(), provider_invoice_id = 'in_x' WHERE id = %s",
])
def test_the_database_refuses_a_delete_or_rewrite_that_bypasses_the_model(policy, producer, sql):
    sub = make_subscription()
    record = usage_record(subscription=sub, producer=producer, usage=usage()).record
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, [record.pk])
    stored = UsageRecord.objects.get(pk=record.pk)
    assert (stored.quantity, stored.cost, stored.invoiced_at) == (1200, 36, None)


def test_invoicing_marks_records_once(policy, producer):
    sub = make_subscription()
    a = usage_record(subscription=sub, producer=producer, usage=usage("a")).record
    b = usage_record(subscription=sub, producer=producer, usage=usage("b", metric="calls", quantity=3, cost=9)).record
    assert usage_mark_invoiced(record_pks=[a.pk], provider_invoice_id="in_usage_1") == 1
    assert usage_mark_invoiced(record_pks=[a.pk], provider_invoice_id="in_usage_1") == 0  # a repeat
    with pytest.raises(UsageRefused) as refused:
        usage_mark_invoiced(record_pks=[a.pk, b.pk], provider_invoice_id="in_usage_2")
    assert refused.value.code == "ALREADY_INVOICED"
    assert UsageRecord.objects.get(pk=b.pk).invoiced_at is None  # all or nothing
    with pytest.raises(DatabaseError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE subscriptions_usagerecord SET provider_invoice_id = 'in_other' WHERE id = %s", [a.pk])
    totals = {m.metric: m for m in usage_totals(sub).metrics}
    assert (totals["tokens"].invoiced_cost, totals["tokens"].uninvoiced_cost) == (36, 0)
    assert (totals["calls"].invoiced_cost, totals["calls"].uninvoiced_cost) == (0, 9)


def test_invoicing_refuses_unknown_records_and_a_blank_invoice(policy, producer):
    sub = make_subscription()
    a = usage_record(subscription=sub, producer=producer, usage=usage("a")).record
    with pytest.raises(UsageRefused, match="no usage record"):
        usage_mark_invoiced(record_pks=[a.pk, a.pk + 1000], provider_invoice_id="in_1")
    with pytest.raises(UsageRefused):
        usage_mark_invoiced(record_pks=[a.pk], provider_invoice_id="  ")
    assert UsageRecord.objects.get(pk=a.pk).invoiced_at is None


def test_the_invoicing_command_marks_once_and_refuses_clearly(policy, producer):
    sub = make_subscription()
    a = usage_record(subscription=sub, producer=producer, usage=usage("a")).record
    out = StringIO()
    call_command("usage_mark_invoiced", "in_cmd_1", str(a.pk), stdout=out)
    assert "Marked 1 usage record(s) invoiced on in_cmd_1" in out.getvalue()
    with pytest.raises(CommandError, match="ALREADY_INVOICED.*nothing was changed"):
        call_command("usage_mark_invoiced", "in_cmd_2", str(a.pk))
    with pytest.raises(CommandError):
        call_command("usage_mark_invoiced", "in_cmd_2", "not-a-number")
    assert UsageRecord.objects.get(pk=a.pk).provider_invoice_id == "in_cmd_1"
