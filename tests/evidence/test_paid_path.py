"""The paid path (issue 21): one invoice.paid for a cycle in grace restores FULL in one
acceptance — recover applies the invoice evidence and its payment fact, moves the cycle and
issues the snapshot in the same transaction — and the walk asks nothing more afterwards."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from django.db import connection
from django.test.utils import CaptureQueriesContext

from dunning.clock import trusted_now
from dunning.evidence.outcome_writes import OUTCOME_FIELDS, event_outcome_record
from dunning.evidence.processing import _subscription_of, invoice_read_is_stale
from dunning.evidence.receipts import receipt_record
from dunning.models import DunningCycle, EventOutcome, FactKind, MonetaryFact, OutboxMessage, ProviderEvent
from dunning.models import TransitionReceipt as Receipt
from dunning.reads.cycles import cycle_read_for_invoice
from entitlements.models import EntitlementSnapshot
from subscriptions.providers.base import ProviderInvoice
from tests.support.builders import make_subscription, open_cycle

# The whole delivery: the webhook view's intake, the event's processing (the provider's fresh
# invoice, its receipt, the walk, the recover acceptance with its snapshot and outbox rows).
# 26 before settlement wrote its rows in one statement and the subscription came with the cycle's
# read (the bound was 33 then); 39 before the acceptance read its rows in one round trip.
MAX_QUERIES_PER_PAID_DELIVERY = 20


def test_a_paid_invoice_restores_full_in_one_acceptance(sim):
    customer = sim.create_customer("payer@example.com", card="ok")
    sub_id = sim.create_subscription(customer, "price_monthly_pro", amount=4900)
    sim.deliver_all()
    sim.set_card(customer, "stolen_card")
    invoice_id = sim.create_renewal_invoice(sub_id)
    sim.provider_attempt(invoice_id)
    sim.deliver_all()
    cycle = DunningCycle.objects.get(invoice__provider_invoice_id=invoice_id)
    assert cycle.state == "GRACE_ACTIVE"
    last_receipt = Receipt.objects.order_by("-pk").values_list("pk", flat=True).first()
    sim.set_card(customer, "ok")
    sim.customer_pays(invoice_id)
    [paid] = [e["id"] for e in sim.pending_events() if e["type"] == "invoice.paid"]

    with CaptureQueriesContext(connection) as queries:
        sim.deliver(paid)

    [receipt] = Receipt.objects.filter(pk__gt=last_receipt)
    assert (receipt.edge, receipt.accepted, receipt.from_state, receipt.to_state) == (
        "recover", True, "GRACE_ACTIVE", "RECOVERED")
    assert sum("FOR UPDATE" in q["sql"] for q in queries.captured_queries) == 1  # one acceptance's lock
    snapshot = EntitlementSnapshot.objects.filter(subscription=cycle.subscription).latest("generation")
    assert (snapshot.profile, snapshot.cause_receipt_id) == ("FULL", receipt.pk)
    assert set(OutboxMessage.objects.filter(receipt=receipt).values_list("topic", flat=True)) == {
        "entitlement.changed", "notification.requested"}
    for message in OutboxMessage.objects.filter(receipt=receipt):  # written in one batch, history kept
        assert list(message.history.values_list("history_type", flat=True)) == ["+"]
    [fact] = MonetaryFact.objects.filter(invoice=cycle.invoice, kind=FactKind.PAYMENT_SUCCEEDED)
    assert fact.amount == 4900
    event = ProviderEvent.objects.get(event_id=paid)
    assert (event.outcome, event.outcome_detail) == (EventOutcome.APPLIED, "recover: GRACE_ACTIVE→RECOVERED")
    assert len(queries.captured_queries) <= MAX_QUERIES_PER_PAID_DELIVERY, "\n".join(
        q["sql"][:160] for q in queries.captured_queries)


def _invoice(invoice_id: str, subscription_id: str) -> ProviderInvoice:
    return ProviderInvoice(id=invoice_id, account="acct_test", subscription_id=subscription_id, customer_id="cus_1",
                           status="paid", amount_due=2500, amount_paid=2500, currency="usd", attempt_count=1,
                           next_payment_attempt=None, payment_refs=(), price_ids=())


def test_the_invoice_subscription_comes_from_its_cycle_read_unless_the_cycle_is_another_subscription(policy):
    """The paid path reads the cycle (with its subscription) once and takes the subscription from
    it; only an invoice whose cycle belongs to another subscription is looked up by its own id."""
    sub, other = make_subscription(), make_subscription()
    cycle = cycle_read_for_invoice("stripe", open_cycle(sub).invoice.provider_invoice_id)
    inv = _invoice(cycle.invoice.provider_invoice_id, sub.provider_subscription_id)
    with CaptureQueriesContext(connection) as queries:
        assert _subscription_of("stripe", inv, cycle) is cycle.subscription
    assert queries.captured_queries == []
    moved = _invoice(inv.id, other.provider_subscription_id)
    assert _subscription_of("stripe", moved, cycle).pk == other.pk
    assert _subscription_of("alipay", inv, cycle) is None
    assert _subscription_of("stripe", _invoice("in_new", "sub_unknown"), None) is None


def test_a_paid_or_void_read_is_never_stale_and_costs_no_query(policy):
    """Nothing is ahead of paid or void, so such a read is current whatever receipts are held: the
    paid path does not ask for them. A read behind a held receipt is still an old copy."""
    cycle = open_cycle(make_subscription())
    receipt_record(object_type="invoice", body={"id": cycle.invoice.provider_invoice_id, "status": "paid",
                                                "amount_due": 2500, "currency": "usd"}, invoice=cycle.invoice)
    paid = _invoice(cycle.invoice.provider_invoice_id, cycle.subscription.provider_subscription_id)
    with CaptureQueriesContext(connection) as queries:
        assert invoice_read_is_stale(paid) == ""
        assert invoice_read_is_stale(replace(paid, status="void"), must_be_paid=True) == ""
    assert queries.captured_queries == []
    assert "stale read" in invoice_read_is_stale(replace(paid, status="open"))


def _event(event_id: str, now: datetime) -> ProviderEvent:
    return ProviderEvent.objects.create(event_id=event_id, event_type="invoice.paid", payload={"id": "evt_1"},
                                        received_at=now, signature_verified=True)


def test_the_outcome_is_written_as_the_models_own_save_would_write_it(policy):
    """`event_outcome_record` is `save(update_fields=OUTCOME_FIELDS)` as one hand-written UPDATE: both
    give the same row, links, timestamp, text with NULs of no kind, and nothing else changes."""
    cycle, now = open_cycle(make_subscription()), trusted_now()
    by_hand, by_orm = _event("evt_outcome_hand", now), _event("evt_outcome_orm", now)
    for event in (by_hand, by_orm):
        event.outcome, event.outcome_detail = EventOutcome.APPLIED, "recover: GRACE_ACTIVE→RECOVERED"
        event.subscription, event.invoice, event.cycle = cycle.subscription, cycle.invoice, cycle
        event.processed_at, event.attempts, event.error = now, 3, ""
    event_outcome_record(by_hand)
    by_orm.save(update_fields=list(OUTCOME_FIELDS))
    columns = [f.attname for f in ProviderEvent._meta.concrete_fields if f.attname not in ("id", "event_id")]
    hand, orm = (ProviderEvent.objects.values(*columns).get(pk=e.pk) for e in (by_hand, by_orm))
    assert hand == orm
    assert (hand["cycle_id"], hand["attempts"], hand["outcome"]) == (cycle.pk, 3, EventOutcome.APPLIED)
    assert set(OUTCOME_FIELDS) <= ProviderEvent.MUTABLE_FIELDS
    cleared = _event("evt_outcome_none", now)
    cleared.outcome, cleared.processed_at, cleared.attempts = EventOutcome.IGNORED, now, 1
    event_outcome_record(cleared)
    row = ProviderEvent.objects.get(pk=cleared.pk)
    assert (row.outcome, row.subscription_id, row.cycle_id, row.processed_at) == (
        EventOutcome.IGNORED, None, None, now)
