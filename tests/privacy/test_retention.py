"""purge_raw_bodies on PostgreSQL: the age boundary, what is never purged, what stays of a purged
row, idempotent re-runs, batches, and the narrow append-only exception it uses."""

from __future__ import annotations

from datetime import timedelta

import pytest

from dunning.append_only import AppendOnlyViolation
from dunning.clock import trusted_now
from dunning.evidence.reprocessing import ReprocessRefused, event_reprocess
from dunning.jobs.framework import job_run
from dunning.models import EventOutcome, MonetaryFact, ProviderEvent, ProviderReceipt, WebhookDelivery
from tests.privacy.scenes import EMAIL, invoice_receipt_with_fact, rejected_delivery, stored_event
from tests.support.actors import LEADS, make_staff, session_client, staff_roles_from_migration
from tests.support.builders import accept, fail_first_payment, make_subscription, open_cycle

DAYS = 90


@pytest.fixture
def now(settings):
    settings.RAW_BODY_RETENTION_DAYS = DAYS
    return trusted_now().replace(microsecond=0)


def purge(now, **kwargs):
    return job_run("purge_raw_bodies", now=now, **kwargs)


def reload(row):
    return type(row).objects.get(pk=row.pk)


def test_age_boundary_and_what_a_purged_row_keeps(db, policy, now):
    cutoff = now - timedelta(days=DAYS)
    old = stored_event("evt_old", EventOutcome.APPLIED, cutoff - timedelta(seconds=1), invoice_id="in_old")
    at_cutoff = stored_event("evt_cutoff", EventOutcome.APPLIED, cutoff)
    young = stored_event("evt_young", EventOutcome.NO_CHANGE, now - timedelta(days=1))
    cycle = open_cycle(make_subscription(), amount=4900)
    receipt, fact = invoice_receipt_with_fact(cycle, cutoff - timedelta(hours=1), cause_event=old)
    young_receipt, _ = invoice_receipt_with_fact(cycle, cutoff + timedelta(hours=1))
    old_delivery = old.deliveries.get()
    digests = (old_delivery.body_sha256, receipt.body_digest)

    run = purge(now)

    assert (run.status, run.changed, run.errors) == ("OK", 3, 0), run.detail
    assert "webhook deliveries: 1 purged" in run.detail and "provider events: 1 purged" in run.detail
    old, old_delivery, receipt = reload(old), reload(old_delivery), reload(receipt)
    assert old.body_purged_at == old_delivery.body_purged_at == receipt.body_purged_at == now
    assert bytes(old_delivery.body) == b"" and receipt.body == {}
    assert old.payload == {"id": "evt_old", "type": "invoice.paid",
                           "data": {"object": {"id": "in_old", "object": "invoice"}}}, "only the ids are left"
    assert ProviderEvent.objects.filter(payload__data__object__id="in_old").get() == old, "gates still find it"
    assert (old_delivery.body_sha256, receipt.body_digest) == digests, "digests stay"
    assert (old.outcome, old.event_type, old.processed_at) == (EventOutcome.APPLIED, "invoice.paid", old.received_at)
    assert (receipt.status, receipt.amount, receipt.currency, receipt.invoice_id) == ("paid", 4900, "usd",
                                                                                       cycle.invoice_id)
    assert reload(fact).receipt_id == receipt.pk and MonetaryFact.objects.count() == 2, "facts stay"
    for kept in (at_cutoff, young, young_receipt, *at_cutoff.deliveries.all(), *young.deliveries.all()):
        kept = reload(kept)
        assert kept.body_purged_at is None, kept
    assert reload(at_cutoff).payload["data"]["object"]["customer_email"].startswith("hmac:"), "kept masked"


def test_pending_failed_and_held_events_are_never_purged(db, now):
    long_ago = now - timedelta(days=DAYS * 3)
    kept = [stored_event(f"evt_{outcome.lower()}", outcome, long_ago)
            for outcome in (EventOutcome.PENDING, EventOutcome.FAILED, EventOutcome.QUARANTINED,
                            EventOutcome.UNATTRIBUTABLE)]
    never_judged = rejected_delivery(long_ago, verdict="PENDING")  # failed on our side
    rejected = rejected_delivery(long_ago)
    receipt = ProviderReceipt.objects.create(
        object_type="invoice", object_id="in_q", status="open", body={"id": "in_q", "customer_email": "hmac:x"},
        body_digest="d" * 64, fetched_at=long_ago, cause_event=kept[2])

    run = purge(now)

    assert run.changed == 1, run.detail  # the rejected delivery only
    assert reload(rejected).body_purged_at == now and bytes(reload(rejected).body) == b""
    for event in kept:
        assert reload(event).body_purged_at is None and reload(event).payload["data"]["object"]["customer_email"]
        assert event.deliveries.get().body_purged_at is None
    assert reload(never_judged).body_purged_at is None
    assert reload(receipt).body_purged_at is None, "a receipt of a held event stays with it"


def test_receipts_of_a_cycle_awaiting_a_conflict_decision_are_kept(db, policy, now):
    cycle = open_cycle(make_subscription(), amount=4900)
    fail_first_payment(cycle)
    assert accept(cycle, "flag_conflict", conflict_reason="paid receipt, then a failure")
    receipt, _ = invoice_receipt_with_fact(cycle, now - timedelta(days=DAYS + 5))
    other = open_cycle(make_subscription(), amount=4900)
    settled_receipt, _ = invoice_receipt_with_fact(other, now - timedelta(days=DAYS + 5))

    purge(now)

    assert reload(receipt).body_purged_at is None and reload(receipt).body["customer_email"].startswith("hmac:")
    assert reload(settled_receipt).body_purged_at == now


def test_a_re_run_purges_nothing_more_and_batches_cover_everything(db, settings, now):
    settings.RAW_BODY_PURGE_BATCH = 2
    long_ago = now - timedelta(days=DAYS + 1)
    events = [stored_event(f"evt_{n}", EventOutcome.APPLIED, long_ago) for n in range(5)]
    lines: list[str] = []

    first = purge(now, progress=lines.append)
    second = purge(now + timedelta(seconds=1))

    assert first.changed == 10 and first.status == "OK", first.detail  # 5 events and their 5 deliveries
    assert sum("provider events" in line for line in lines) == 3, "5 rows in batches of 2"
    assert (second.examined, second.changed) == (0, 0), "a purged row is never selected again"
    assert {reload(e).body_purged_at for e in events} == {now}, "the first purge's time stays"


def test_a_now_ahead_of_the_trusted_clock_purges_nothing(db, now):
    event = stored_event("evt_early", EventOutcome.APPLIED, now - timedelta(days=DAYS - 1))
    run = purge(now + timedelta(days=2))
    assert (run.changed, run.refused) == (0, 1) and "trusted clock" in run.detail
    assert reload(event).body_purged_at is None


def test_the_append_only_exception_is_only_the_purge(db, now):
    event = stored_event("evt_guard", EventOutcome.APPLIED, now - timedelta(days=DAYS + 1))
    delivery = event.deliveries.get()
    with pytest.raises(AppendOnlyViolation):
        ProviderEvent.objects.filter(pk=event.pk).update(payload={})
    with pytest.raises(AppendOnlyViolation):
        WebhookDelivery.objects.filter(pk=delivery.pk).update(body=b"", body_purged_at=now)
    event.payload = {}
    with pytest.raises(AppendOnlyViolation):
        event.save(update_fields=["payload"])
    with pytest.raises(AppendOnlyViolation, match="no raw body"):
        MonetaryFact.objects.all().purge_raw_body(now=now)
    assert ProviderEvent.objects.filter(pk=event.pk).purge_raw_body(now=now) == 1
    assert ProviderEvent.objects.filter(pk=event.pk).purge_raw_body(now=now + timedelta(days=1)) == 0
    assert reload(event).body_purged_at == now


def test_re_processing_a_purged_event_is_refused_in_plain_words(db, now):
    staff_roles_from_migration()
    lead = make_staff("lead", LEADS, email="lead@example.com")
    event = stored_event("evt_gone", EventOutcome.APPLIED, now - timedelta(days=DAYS + 1))
    purge(now)
    with pytest.raises(ReprocessRefused) as refused:
        event_reprocess(event_pk=event.pk, user=lead, reason="customer asks", ticket="SUP-1", now=now)
    assert refused.value.code == "RAW_BODY_PURGED"
    assert f"raw body was purged on {now:%Y-%m-%d}" in refused.value.detail
    assert EMAIL not in str(reload(event).payload)


def test_the_api_answers_409_for_a_purged_event(db, now):
    lead = make_staff("lead-api", LEADS)
    event = stored_event("evt_gone_api", EventOutcome.APPLIED, now - timedelta(days=DAYS + 1))
    purge(now)
    response = session_client(lead).post(f"/api/v1/events/{event.event_id}/reprocess",
                                         {"reason": "customer asks", "ticket": "SUP-2"}, format="json",
                                         HTTP_IDEMPOTENCY_KEY="purged-1")
    assert response.status_code == 409, response.content
    problem = response.json()
    assert problem["code"] == "RAW_BODY_PURGED" and "raw body was purged on" in problem["detail"]
