"""The named scenarios of seeds 000/001 ("Inject disorder, outages and boundary payments") and
seed 003 §6 (five failure classes), each as a readable script against the simulator and the
real application. Each asserts its outcome and that the auditor saw no violation."""

from __future__ import annotations

from datetime import timedelta

from dunning.acceptance.aggregate import EMPTY_ROOT
from dunning.models import MonetaryFact, PaymentAttempt, ProviderEvent
from entitlements.models import EntitlementSnapshot


def _clean(w):
    assert w.audit() == [], "\n".join(map(str, w.violations))


def _to_retry_due(w, invoice):
    w.run_jobs(only=("local_retries",))
    w.move_to(w.cycle(invoice).next_attempt_at + timedelta(seconds=1))


# ---- seeds 000/001 -------------------------------------------------------------------------------

def test_out_of_order_and_duplicate_webhooks(world):
    with world("standard") as w:
        invoice = w.failed_renewal(deliver=False)
        w.sim.set_card(w.customers[0], "ok")
        w.sim.customer_pays(invoice)
        w.sim.faults.duplicate_next_delivery(20)
        w.deliver("reversed")  # invoice.paid first, the old failure last, everything twice
        cycle = w.cycle(invoice)
        assert cycle.state == "RECOVERED"
        assert cycle.subscription.entitlement_profile == "FULL"
        assert MonetaryFact.objects.filter(invoice=cycle.invoice, kind="PAYMENT_SUCCEEDED").count() == 1
        _clean(w)
    assert w.violations == []


def test_lost_retry_response_is_resolved_on_the_same_key(world):
    with world("local") as w:
        invoice = w.failed_renewal()
        _to_retry_due(w, invoice)
        w.sim.set_card(w.customers[0], "ok")
        w.sim.faults.error_500("POST /v1/invoices/*/pay", apply=True, count=1)
        w.run_jobs(only=("local_retries",))
        assert w.cycle(invoice).state == "PAYMENT_UNKNOWN"
        _clean(w)
        w.advance(600)  # the unknown-payments job owns it and asks the provider
        cycle = w.cycle(invoice)
        assert cycle.state == "RECOVERED"
        (attempt,) = PaymentAttempt.objects.filter(cycle=cycle, origin="LOCAL")
        assert [c["idempotency_key"] for c in w.sim.successful_charges(invoice)] == [attempt.idempotency_key]
        _clean(w)
    assert w.violations == []


def test_rescheduled_next_attempt_is_stored_as_evidence(world):
    with world("standard") as w:
        invoice = w.failed_renewal()
        assert w.cycle(invoice).state == "RETRY_SCHEDULED"
        later = int((w.now() + timedelta(days=4)).timestamp())
        w.sim.reschedule(invoice, later)
        w.deliver()
        cycle = w.cycle(invoice)
        assert cycle.state == "RETRY_SCHEDULED" and int(cycle.next_attempt_at.timestamp()) == later
        assert not PaymentAttempt.objects.filter(cycle=cycle, origin="LOCAL").exists(), "nothing charged locally"
        _clean(w)
    assert w.violations == []


def test_scheduler_outage_catch_up_recovers_a_payment_made_meanwhile(world):
    with world("standard", "standard") as w:
        paid = w.failed_renewal(0, "stolen_card")
        unpaid = w.failed_renewal(1, "stolen_card")
        w.step_outage(type("S", (), {"a": 1.0})())  # five days without the scheduler
        w.advance(3 * 86400)
        w.sim.set_card(w.customers[0], "ok")
        w.sim.customer_pays(paid)
        with w.sim.lock:
            w.sim.outbox.clear()  # and the webhook is lost
        w.advance(9 * 86400)  # the outage ends; catch-up runs in CATCH_UP_ORDER
        assert w.cycle(paid).state == "RECOVERED", "the fresh fetch found the payment"
        assert w.cycle(unpaid).state == "RESTRICTED", "restricted only with a fresh unpaid receipt"
        _clean(w)
    assert w.violations == []


def test_payment_at_the_deadline_boundary_wins(world):
    with world("standard") as w:
        invoice = w.failed_renewal(0, "expired_card")
        deadline = w.cycle(invoice).grace_expires_at
        w.move_to(deadline)
        w.sim.customer_pays(invoice)  # no webhook yet: the sweep at the same instant must find it
        w.run_jobs(only=("grace_expiry", "restriction"), force=True)
        cycle = w.cycle(invoice)
        assert cycle.state == "RECOVERED" and cycle.restricted_at is None
        _clean(w)
    assert w.violations == []


def test_mark_uncollectible_keeps_the_debt_blocking(world):
    with world("standard") as w:
        invoice = w.failed_renewal(0, "stolen_card")
        w.sim.mark_uncollectible(invoice)
        w.deliver()
        cycle = w.cycle(invoice)
        assert cycle.invoice.status == "uncollectible"
        assert cycle.subscription.outstanding_cycle_root != EMPTY_ROOT
        assert cycle.subscription.entitlement_profile != "FULL"
        assert MonetaryFact.objects.filter(invoice=cycle.invoice, kind="MARKED_UNCOLLECTIBLE").exists()
        _clean(w)
    assert w.violations == []


def test_two_open_invoices_one_paid_stays_restricted(world):
    with world("standard") as w:
        first = w.failed_renewal(0, "stolen_card")
        second = w.failed_renewal(0, "stolen_card")
        generation = w.subscription().entitlement_generation
        w.sim.customer_pays(first)
        w.deliver()
        assert w.cycle(first).state == "RECOVERED"
        sub = w.subscription()
        assert w.cycle(second).state not in ("RECOVERED", "CLOSED_VOID")
        assert sub.entitlement_profile != "FULL" and sub.outstanding_cycle_root != EMPTY_ROOT
        assert not EntitlementSnapshot.objects.filter(subscription=sub, profile="FULL",
                                                      generation__gt=generation).exists()
        _clean(w)
    assert w.violations == []


def test_outbox_replay_changes_nothing(world):
    with world("standard") as w:
        invoice = w.failed_renewal(0, "stolen_card")
        w.sim.customer_pays(invoice)
        w.deliver()
        w.run_jobs(only=("outbox_relay",))
        before = (w.subscription().entitlement_generation, EntitlementSnapshot.objects.count())
        w.step_outbox_replay(type("S", (), {"a": 0.0, "b": 0.0, "n": 100})())
        w.step_outbox_replay(type("S", (), {"a": 0.0, "b": 0.0, "n": 100})())
        assert (w.subscription().entitlement_generation, EntitlementSnapshot.objects.count()) == before
        _clean(w)
    assert w.violations == []


def test_stale_provider_read_never_restricts_a_paid_customer(world):
    with world("standard") as w:
        invoice = w.failed_renewal(0, "stolen_card")
        w.sim.customer_pays(invoice)
        w.sim.faults.stale_read(invoice, 3)  # the paid event's fetch sees the invoice one version old
        w.deliver()
        w.advance(8 * 86400)  # grace runs out; the sweep fetches fresh before restricting
        cycle = w.cycle(invoice)
        assert cycle.state == "RECOVERED" and cycle.restricted_at is None
        _clean(w)
    assert w.violations == []


def test_chargeback_after_restriction_reopens_debt_and_stays_restricted(world):
    with world("standard") as w:
        first_invoice = w.sim.get(w.subscriptions[0])["latest_invoice"]  # paid at sign-up
        unpaid = w.failed_renewal(0, "stolen_card")
        w.advance(8 * 86400)
        assert w.cycle(unpaid).state == "RESTRICTED"
        charge = w.sim.successful_charges(first_invoice)[0]["id"]
        dispute = w.sim.open_dispute(charge)
        w.deliver()
        w.sim.close_dispute(dispute, won=False)
        w.deliver()
        sub = w.subscription()
        assert sub.entitlement_profile == "SUSPENDED" and sub.outstanding_cycle_root != EMPTY_ROOT
        assert MonetaryFact.objects.filter(kind="DISPUTE_LOST", invoice__provider_invoice_id=first_invoice).exists()
        _clean(w)
    assert w.violations == []


# ---- seed 003 §6: five failure classes ----------------------------------------------------------------

def test_class_timeout_is_unknown_then_resolved_by_query(world):
    with world("local") as w:
        invoice = w.failed_renewal()
        _to_retry_due(w, invoice)
        w.sim.set_card(w.customers[0], "ok")
        w.sim.faults.timeout("POST /v1/invoices/*/pay", apply=True, hold_seconds=0.01)
        w.run_jobs(only=("local_retries",))
        assert w.cycle(invoice).state == "PAYMENT_UNKNOWN"
        w.advance(600)
        assert w.cycle(invoice).state == "RECOVERED"
        assert len(w.sim.successful_charges(invoice)) == 1
        _clean(w)
    assert w.violations == []


def test_class_duplicate_notification_is_processed_once(world):
    with world("standard") as w:
        invoice = w.failed_renewal(deliver=False)
        w.sim.faults.duplicate_next_delivery(50)
        w.deliver()
        paid_event = w.sim.events_of_type("invoice.payment_failed")[-1]["id"]
        w.sim.deliver(paid_event, duplicate=3)
        assert ProviderEvent.objects.filter(event_id=paid_event).count() == 1
        cycle = w.cycle(invoice)
        assert MonetaryFact.objects.filter(invoice=cycle.invoice, kind="PAYMENT_FAILED").count() == 1
        _clean(w)
    assert w.violations == []


def test_class_insufficient_funds_is_retried(world):
    with world("standard", "local") as w:
        provider = w.failed_renewal(0, "insufficient_funds")
        local = w.failed_renewal(1, "insufficient_funds")
        assert w.cycle(provider).failure_class == "RETRYABLE" and w.cycle(provider).state == "RETRY_SCHEDULED"
        w.run_jobs(only=("local_retries",))
        assert w.cycle(local).state == "RETRY_SCHEDULED"
        _clean(w)
    assert w.violations == []


def test_class_revoked_authorisation_is_never_retried(world):
    with world("annual") as w:
        invoice = w.failed_renewal(0, "revocation_of_authorization")
        cycle = w.cycle(invoice)
        assert cycle.failure_class == "NON_RETRYABLE" and cycle.customer_action_required
        assert cycle.next_attempt_at is None and cycle.state != "RETRY_SCHEDULED"
        _clean(w)
    assert w.violations == []


def test_class_paid_with_delayed_notification(world):
    with world("standard") as w:
        invoice = w.failed_renewal(0, "stolen_card")
        w.sim.faults.delay_deliveries(2 * 86400)
        w.sim.customer_pays(invoice)
        w.deliver_due = w.sim.deliver_due
        assert w.cycle(invoice).state == "GRACE_ACTIVE", "nothing arrived yet"
        w.advance(3 * 86400)  # the delayed webhooks arrive on their own
        cycle = w.cycle(invoice)
        assert cycle.state == "RECOVERED" and cycle.subscription.entitlement_profile == "FULL"
        _clean(w)
    assert w.violations == []
