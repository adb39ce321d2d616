"""Named scenarios of the grace deadline and the contract line: provider retries that outlast
grace, cancellations at the provider (now, and at the period end), pauses, a plan change in the
middle of dunning, a dunning cancellation carried to the provider (confirmed, or alerted), and a
job run asked at a `now` days ahead of the trusted clock. Each asserts its outcome and that the
auditor saw no violation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dunning.acceptance.aggregate import EMPTY_ROOT
from dunning.acceptance.inputs import Cause, Expect
from dunning.acceptance.transitions import cycle_accept_transition
from dunning.models import Alert, JobRun, TransitionReceipt


def _clean(w):
    assert w.audit() == [], "\n".join(map(str, w.violations))


def _at(ts: int) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


def test_grace_is_a_deadline_even_with_provider_retries_scheduled_after_it(world):
    with world("standard", retries="smart-14d") as w:
        invoice = w.failed_renewal(0, "insufficient_funds")
        cycle = w.cycle(invoice)
        assert cycle.state == "RETRY_SCHEDULED" and cycle.subscription.entitlement_profile == "READ_EXPORT_NO_NEW_JOBS"
        deadline = cycle.grace_expires_at
        w.advance((deadline - w.now()).total_seconds() + 90)  # the provider retries on days 1, 2, 4, 6 meanwhile
        assert w.counters.get("provider_retry", 0) >= 3
        assert w.sim.get(invoice)["next_payment_attempt"] is not None, "the provider still has retries to go"
        cycle = w.cycle(invoice)
        assert cycle.state == "RESTRICTED" and cycle.subscription.entitlement_profile == "SUSPENDED"
        _clean(w)
        w.sim.set_card(w.customers[0], "ok")  # a later provider retry succeeds: access comes back
        w.advance(3 * 86400)
        cycle = w.cycle(invoice)
        assert cycle.state == "RECOVERED" and cycle.subscription.entitlement_profile == "FULL"
        _clean(w)
    assert w.violations == []


def test_customer_cancels_at_the_provider_while_in_dunning(world):
    with world("standard") as w:
        invoice = w.failed_renewal(0, "insufficient_funds")
        w.sim.cancel_subscription(w.subscriptions[0])
        w.deliver()
        sub = w.subscription()
        assert sub.contract_phase == "canceled" and sub.entitlement_profile == "REVOKED"
        assert w.sim.get(invoice)["status"] == "open" and w.sim.get(invoice)["next_payment_attempt"] is None
        assert sub.outstanding_cycle_root != EMPTY_ROOT, "the debt stays a debt"
        _clean(w)
        w.advance(9 * 86400)
        assert w.cycle(invoice).state == "RESTRICTED"
        assert w.subscription().entitlement_profile == "REVOKED"
        w.sim.customer_pays(invoice)
        w.deliver()
        assert w.cycle(invoice).state == "RECOVERED"
        assert w.subscription().entitlement_profile == "REVOKED", "paying the old invoice does not reopen the contract"
        _clean(w)
    assert w.violations == []


def test_cancel_at_period_end_closes_access_at_the_end_before_the_provider_says_so(world):
    with world("standard") as w:
        sub_id = w.subscriptions[0]
        w.sim.cancel_subscription(sub_id, at_period_end=True)
        w.deliver()
        sub = w.subscription()
        assert sub.cancel_at_period_end and sub.entitlement_profile == "FULL"
        end = _at(w.sim.get(sub_id)["current_period_end"])
        w.advance((end - w.now()).total_seconds() - 60)
        w.sim.faults.delay_deliveries(2 * 86400)  # the provider's customer.subscription.deleted comes late
        w.sim.faults.error_500("GET /v1/subscriptions/*", apply=False, count=10_000)  # and reads of it fail
        w.advance(150)
        assert w.sim.get(sub_id)["status"] == "canceled"
        sub = w.subscription()
        assert sub.provider_status != "canceled", "neither the deletion event nor a fresh read has arrived"
        assert sub.contract_phase == "canceled" and sub.entitlement_profile == "REVOKED"
        _clean(w)
        w.sim.faults.clear()
        w.advance(3 * 86400)
        assert w.subscription().provider_status == "canceled"
        _clean(w)
    assert w.violations == []


def test_pause_limits_access_until_it_resumes(world):
    with world("standard") as w:
        sub_id = w.subscriptions[0]
        w.sim.pause_subscription(sub_id, behavior="void")  # no resume date
        w.deliver()
        assert w.subscription().entitlement_profile == "READ_EXPORT_NO_NEW_JOBS"
        invoice = w.sim.create_renewal_invoice(sub_id)  # issued while paused: voided, never attempted
        w.deliver()
        assert w.sim.get(invoice)["status"] == "void" and not w.sim.successful_charges(invoice)
        assert w.subscription().outstanding_cycle_root == EMPTY_ROOT
        _clean(w)
        w.sim.resume_subscription(sub_id)
        w.deliver()
        assert w.subscription().entitlement_profile == "FULL"
        _clean(w)
        w.sim.pause_subscription(sub_id, resumes_at=w.now() + timedelta(days=2), behavior="keep_as_draft")
        w.deliver()
        assert w.subscription().entitlement_profile == "READ_EXPORT_NO_NEW_JOBS"
        _clean(w)
        w.advance(2 * 86400 + 120)  # the resume date passes: the contract_deadlines job restores access
        assert w.subscription().entitlement_profile == "FULL"
        _clean(w)
    assert w.violations == []


def test_plan_change_mid_dunning_binds_only_new_invoices(world):
    with world("standard") as w:
        sub_id = w.subscriptions[0]
        open_invoice = w.failed_renewal(0, "insufficient_funds")
        assert w.cycle(open_invoice).policy.identity == "standard-monthly@6"
        w.sim.change_price(sub_id, "price_annual_pro", interval="year", amount=49000)
        w.deliver()
        sub = w.subscription()
        assert sub.policy.identity == "annual-no-grace@1" and sub.billing_interval == "year"
        assert w.cycle(open_invoice).policy.identity == "standard-monthly@6", "the open cycle keeps its policy"
        annual = w.failed_renewal(0, "insufficient_funds")
        assert w.cycle(annual).policy.identity == "annual-no-grace@1"
        assert w.sim.get(annual)["amount_due"] == 49000
        _clean(w)
        w.advance(8 * 86400)
        assert w.cycle(open_invoice).state == "RESTRICTED" and w.cycle(annual).state == "RESTRICTED"
        _clean(w)
    assert w.violations == []


def test_jobs_asked_days_ahead_of_the_clock_change_nothing(world):
    with world("standard", "local", "annual") as w:
        provider = w.failed_renewal(0, "stolen_card")
        local = w.failed_renewal(1, "insufficient_funds")
        annual = w.failed_renewal(2, "insufficient_funds")
        w.run_jobs(force=True)  # whatever is due now is done (the annual cycle has no grace: restricted)
        before = {i: (w.cycle(i).state, w.cycle(i).generation) for i in (provider, local, annual)}
        w.run_jobs_ahead(timedelta(days=5))  # past the local retry's time and the P3D reminder's
        assert {i: (w.cycle(i).state, w.cycle(i).generation) for i in (provider, local, annual)} == before
        assert JobRun.objects.filter(job="local_retries", run_for__gt=w.now(), refused__gt=0).exists()
        _clean(w)
        w.run_jobs_ahead(timedelta(days=8))  # past the grace deadlines: expire_grace is refused
        assert {i: (w.cycle(i).state, w.cycle(i).generation) for i in (provider, local, annual)} == before
        assert not TransitionReceipt.objects.filter(accepted=True, trusted_time__gt=w.now() + timedelta(seconds=5)
                                                    ).exists(), "no step was accepted at a now ahead of the clock"
        assert not TransitionReceipt.objects.filter(accepted=False).exclude(
            rejection_reason="NOW_AFTER_TRUSTED_CLOCK").filter(trusted_time__gt=w.now() + timedelta(seconds=5)
                                                               ).exists(), "refused only for being ahead"
        _clean(w)
    assert w.violations == []


def _restricted_then_canceled_by_staff(w):
    invoice = w.failed_renewal(0, "stolen_card")
    w.advance(8 * 86400)
    cycle = w.cycle(invoice)
    assert cycle.state == "RESTRICTED"
    result = cycle_accept_transition(
        cycle_pk=cycle.pk, edge="request_cancellation", expect=Expect.from_cycle(cycle),
        cause=Cause.staff(w.lead, reason="customer asked to close the account", ticket="SIM-1"), now=w.now())
    assert result.accepted, result
    w.run_jobs(only=("cancellation",))
    assert w.cycle(invoice).state == "CANCELED"
    return invoice


def test_dunning_cancellation_reaches_the_provider_and_is_confirmed(world):
    with world("standard") as w:
        _restricted_then_canceled_by_staff(w)
        assert w.subscription().provider_cancel_requested_at is not None
        w.run_jobs(only=("outbox_relay",))
        assert w.sim.get(w.subscriptions[0])["status"] == "canceled"
        sub = w.subscription()
        assert sub.provider_cancel_confirmed_at is not None and sub.entitlement_profile == "REVOKED"
        _clean(w)
    assert w.violations == []


def test_unconfirmed_provider_cancellation_raises_an_alert(world):
    with world("standard") as w:
        w.sim.faults.error_500("DELETE /v1/subscriptions/*", apply=False, count=10_000)
        _restricted_then_canceled_by_staff(w)
        w.advance(2 * 3600)
        sub = w.subscription()
        assert sub.provider_cancel_confirmed_at is None and w.sim.get(w.subscriptions[0])["status"] != "canceled"
        assert Alert.objects.filter(kind="CANCEL_UNCONFIRMED", subscription=sub, resolved_at__isnull=True).exists()
        _clean(w)
        w.sim.faults.clear()
        w.advance(2 * 3600)  # the relay's back-off comes round; the provider confirms; the alert clears
        sub = w.subscription()
        assert sub.provider_cancel_confirmed_at is not None
        assert not Alert.objects.filter(kind="CANCEL_UNCONFIRMED", subscription=sub, resolved_at__isnull=True).exists()
        _clean(w)
    assert w.violations == []
