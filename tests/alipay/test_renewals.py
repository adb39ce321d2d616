"""Seed 003's renewal through Alipay, end to end against the simulator on loopback: the agreement
imports the subscription, the merchant opens each renewal order and sends its deduction, the
order is read back from alipay.trade.query, and retries follow the failure's cause."""

from __future__ import annotations

from datetime import timedelta

from dunning.acceptance.inputs import Cause
from dunning.actions.retry_now import cycle_retry_now
from dunning.jobs.framework import job_run
from dunning.models import DunningCycle, JobRun, MonetaryFact, PaymentAttempt, ProviderEvent
from subscriptions.models import AlipayRenewalOrder, AlipayTrade, Subscription
from tests.support.actors import AGENTS, make_staff


def _cycle(order: AlipayRenewalOrder) -> DunningCycle:
    return DunningCycle.objects.select_related("invoice", "subscription").get(
        invoice__provider="alipay", invoice__provider_invoice_id=order.order_no)


def _renew(alipay, time_machine, sub: Subscription) -> AlipayRenewalOrder:
    time_machine.move_to(sub.current_period_end + timedelta(minutes=1), tick=True)
    job_run("alipay_renewals")
    return AlipayRenewalOrder.objects.get(agreement__agreement_no=sub.provider_subscription_id,
                                          period_start=sub.current_period_end)


def test_the_agreement_imports_the_subscription_bound_to_the_alipay_policy(alipay):
    sub = alipay.sign_up()
    assert (sub.provider, sub.provider_account, sub.price_id) == ("alipay", "2021000000000001", "alipay_monthly")
    assert sub.policy.name == "alipay-monthly" and sub.entitlement_profile == "FULL"
    assert sub.customer.provider == "alipay" and sub.current_period_end is not None
    event = ProviderEvent.objects.get(provider="alipay", event_type="dut_user_sign")
    assert event.outcome == "APPLIED" and event.account == "2021000000000001"


def test_a_paid_renewal_settles_from_the_trade_query_and_its_notification_changes_nothing(alipay, time_machine):
    sub = alipay.sign_up(balance_fen=10_000)
    order = _renew(alipay, time_machine, sub)
    cycle = _cycle(order)
    assert cycle.state == "RECOVERED" and cycle.invoice.status == "paid"
    (trade,) = AlipayTrade.objects.filter(order=order)
    assert trade.status == "TRADE_SUCCESS" and alipay.sim.balance(trade.order.agreement.alipay_user_id) == 7_000
    assert MonetaryFact.objects.filter(invoice=cycle.invoice, kind="PAYMENT_SUCCEEDED",
                                       provider_ref=trade.out_trade_no).count() == 1
    # Alipay's notification of the same trade arrives afterwards: stored, answered `success`, no change.
    assert alipay.relay() == [(200, b"success")]
    event = ProviderEvent.objects.get(provider="alipay", event_type="trade_status_sync.TRADE_SUCCESS")
    assert event.outcome == "NO_CHANGE" and event.invoice == cycle.invoice
    assert job_run("alipay_renewals").changed == 0, "the period's order is opened once"


def test_insufficient_balance_waits_six_hours_then_a_day_and_recovers(alipay, time_machine):
    sub = alipay.sign_up(balance_fen=100)
    order = _renew(alipay, time_machine, sub)
    cycle = _cycle(order)
    assert cycle.state in ("GRACE_ACTIVE", "RETRY_SCHEDULED"), cycle.state
    assert cycle.subscription.entitlement_profile == "LIMITED"
    job_run("local_retries")
    cycle = _cycle(order)
    assert cycle.state == "RETRY_SCHEDULED"
    first_wait = cycle.next_attempt_at - cycle.updated_at
    assert timedelta(hours=5, minutes=59) < first_wait <= timedelta(hours=6, minutes=1)
    time_machine.move_to(cycle.next_attempt_at + timedelta(seconds=1), tick=True)
    job_run("local_retries")
    cycle = _cycle(order)
    assert cycle.state in ("GRACE_ACTIVE", "RETRY_SCHEDULED")
    job_run("local_retries")
    cycle = _cycle(order)
    assert cycle.state == "RETRY_SCHEDULED" and cycle.next_attempt_at - cycle.updated_at > timedelta(hours=23)
    alipay.sim.set_balance(order.agreement.alipay_user_id, 10_000)
    time_machine.move_to(cycle.next_attempt_at + timedelta(seconds=1), tick=True)
    job_run("local_retries")
    cycle = _cycle(order)
    assert cycle.state == "RECOVERED" and cycle.subscription.entitlement_profile == "FULL"
    trades = list(AlipayTrade.objects.filter(order=order).order_by("sent_at"))
    assert [t.status for t in trades] == ["FAILED", "FAILED", "TRADE_SUCCESS"]
    assert len({t.out_trade_no for t in trades}) == 3, "each attempt has its own out_trade_no"
    assert [t.sub_code for t in trades[:2]] == ["ACQ.BUYER_BALANCE_NOT_ENOUGH"] * 2


def test_a_revoked_agreement_stops_retries_and_asks_the_customer(alipay, time_machine):
    sub = alipay.sign_up(balance_fen=10_000)
    alipay.sim.revoke_agreement(sub.provider_subscription_id)
    # The revocation arrives after the renewal order was opened: the deduction is refused.
    order = _renew(alipay, time_machine, sub)
    cycle = _cycle(order)
    assert cycle.customer_action_required and cycle.next_attempt_at is None
    assert cycle.state == "GRACE_ACTIVE" and cycle.subscription.entitlement_profile == "LIMITED"
    # The customer presses "Retry payment now": refused in Alipay's words, not a card's.
    refused = cycle_retry_now(cycle_pk=cycle.pk, cause=Cause.system("test"))
    assert refused.code == "NON_RETRYABLE_NO_RETRY" and "sign the deduction agreement again" in refused.detail
    assert "card" not in refused.detail
    alipay.relay()
    sub.refresh_from_db()
    assert sub.cancel_at_period_end, "a revoked agreement renews no more"


def test_a_timeout_that_charged_is_found_by_the_query_never_charged_twice(alipay, time_machine):
    sub = alipay.sign_up(balance_fen=10_000)
    alipay.sim.faults.arm("timeout", "alipay.trade.pay", apply=True, hold_seconds=1.5)
    order = _renew(alipay, time_machine, sub)
    (trade,) = AlipayTrade.objects.filter(order=order)
    cycle = _cycle(order)
    # The query in the read-back found the charge: paid once, never sent again.
    assert cycle.state == "RECOVERED" and trade.status == "TRADE_SUCCESS"
    assert alipay.sim.balance(order.agreement.alipay_user_id) == 7_000
    assert len([t for t in alipay.sim.trade_list() if t["out_trade_no"] == trade.out_trade_no]) == 1


def test_a_timeout_that_did_not_charge_is_sent_again_under_the_same_out_trade_no(alipay, time_machine):
    sub = alipay.sign_up(balance_fen=10_000)
    alipay.sim.faults.arm("timeout", "alipay.trade.pay", apply=False, hold_seconds=1.5)
    order = _renew(alipay, time_machine, sub)
    run = JobRun.objects.filter(job="alipay_renewals").latest("pk")
    # The read-back's query found no trade (the timeout charged nothing), so the unanswered renewal
    # went out again in the same run, under the same out_trade_no: paid once.
    (trade,) = AlipayTrade.objects.filter(order=order)
    assert "asked again" in run.detail, run.detail
    assert trade.status == "TRADE_SUCCESS" and _cycle(order).state == "RECOVERED"
    assert [t["out_trade_no"] for t in alipay.sim.trade_list()] == [trade.out_trade_no]
    assert alipay.sim.balance(order.agreement.alipay_user_id) == 7_000


def test_a_duplicate_notification_is_written_once(alipay, time_machine):
    sub = alipay.sign_up(balance_fen=10_000)
    alipay.sim.faults.duplicate_notifications()
    _renew(alipay, time_machine, sub)
    assert alipay.relay() == [(200, b"success"), (200, b"success")]
    assert ProviderEvent.objects.filter(provider="alipay", event_type="trade_status_sync.TRADE_SUCCESS").count() == 1


def test_a_local_retry_unknown_is_resolved_by_query(alipay, time_machine):
    sub = alipay.sign_up(balance_fen=100)
    order = _renew(alipay, time_machine, sub)
    job_run("local_retries")
    cycle = _cycle(order)
    alipay.sim.set_balance(order.agreement.alipay_user_id, 10_000)
    alipay.sim.faults.arm("timeout", "alipay.trade.pay", apply=True, hold_seconds=1.5)
    time_machine.move_to(cycle.next_attempt_at + timedelta(seconds=1), tick=True)
    job_run("local_retries")
    cycle = _cycle(order)
    assert cycle.state == "PAYMENT_UNKNOWN"
    job_run("unknown_payments")
    cycle = _cycle(order)
    assert cycle.state == "RECOVERED"
    assert PaymentAttempt.objects.filter(cycle=cycle, origin="LOCAL", state="SUCCEEDED").count() == 1
    assert alipay.sim.balance(order.agreement.alipay_user_id) == 7_000


def test_support_staff_read_the_deductions_sent_for_an_order_and_change_nothing(alipay, time_machine, client):
    sub = alipay.sign_up(balance_fen=100)
    order = _renew(alipay, time_machine, sub)
    (trade,) = AlipayTrade.objects.filter(order=order)
    agent = make_staff("agent-ali", AGENTS)
    client.force_login(agent)
    page = client.get(f"/admin/subscriptions/alipayrenewalorder/{order.pk}/change/")
    assert page.status_code == 200
    assert trade.out_trade_no in page.text and "ACQ.BUYER_BALANCE_NOT_ENOUGH" in page.text
    listing = client.get("/admin/subscriptions/alipaytrade/?status__exact=FAILED")
    assert listing.status_code == 200 and trade.out_trade_no in listing.text
    refused = client.post(f"/admin/subscriptions/alipaytrade/{trade.pk}/change/", {"status": "TRADE_SUCCESS"})
    assert refused.status_code == 403
    trade.refresh_from_db()
    assert trade.status == "FAILED"
