""""Pay now" under provider retry authority (issue 15, item 5): the customer pays the open invoice
through the provider under an idempotency key committed before the call; a timeout is unknown,
never a second charge; the page offers only what can work and names the plan by its product.
The last test walks it in Chromium: a hard-declined customer saves a new card on the provider's
page (the simulator's), presses "Pay now" and gets full access."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse

from dunning.acceptance.edges import local_idempotency_key
from dunning.acceptance.inputs import Cause
from dunning.actions.retry_now import cycle_pay_now, pay_now_blocker
from dunning.jobs.framework import job_run
from dunning.models import PaymentAttempt
from dunning.models import TransitionReceipt as Receipt
from subscriptions.providers.registry import get_provider
from tests.console.conftest import PASSWORD
from tests.console.test_billing_pages import assert_plain
from tests.support.browser import screenshot
from tests.support.builders import accept
from tests.support.scenarios import cycle_of, failed_renewal


@pytest.fixture
def payer(django_user_model):
    return django_user_model.objects.create_user("payer", password=PASSWORD)


@pytest.fixture
def customer_cause(payer):
    return Cause.customer(payer)


def local_attempts(invoice_id: str) -> list[PaymentAttempt]:
    return list(PaymentAttempt.objects.filter(cycle__invoice__provider_invoice_id=invoice_id, origin="LOCAL")
                .order_by("created_at", "pk"))


def charged_keys(sim, invoice_id: str) -> list[str]:
    return [c["idempotency_key"] for c in sim.successful_charges(invoice_id)]


def link_login(user, sub) -> None:
    customer = sub.customer
    customer.user = user
    customer.save(update_fields=["user"])


# --- the service --------------------------------------------------------------------------------

def test_pay_now_charges_once_under_a_key_persisted_before_the_call(sim, customer_cause, monkeypatch):
    customer, invoice_id, cycle = failed_renewal(sim, decline="insufficient_funds")
    assert cycle.state == "RETRY_SCHEDULED" and cycle.policy.retry_authority == "PAYMENT_PROVIDER"
    sim.set_card(customer, "ok")  # the bank account has money again
    provider, seen = get_provider(), []
    original = provider.pay_invoice

    def pay(invoice: str, *, idempotency_key: str):  # noqa: ANN202
        seen.append(PaymentAttempt.objects.values_list("state", "origin").get(idempotency_key=idempotency_key))
        return original(invoice, idempotency_key=idempotency_key)

    monkeypatch.setattr(provider, "pay_invoice", pay)
    outcome = cycle_pay_now(cycle_pk=cycle.pk, cause=customer_cause)

    assert outcome.status == "PAID", outcome
    assert seen == [("DISPATCHING", "LOCAL")], "the attempt and its key were stored before the provider was called"
    paid = cycle_of(invoice_id)
    assert paid.state == "RECOVERED" and paid.subscription.entitlement_profile == "FULL"
    (attempt,) = local_attempts(invoice_id)
    assert attempt.state == "SUCCEEDED" and attempt.idempotency_key == local_idempotency_key(paid.cycle_id, 2)
    assert charged_keys(sim, invoice_id) == [attempt.idempotency_key]
    dispatched = Receipt.objects.get(cycle=paid, edge="dispatch_customer_payment")
    assert dispatched.accepted and dispatched.from_state == dispatched.to_state == "RETRY_SCHEDULED"
    sim.deliver_all()  # the provider's own events about the same payment change nothing
    assert cycle_of(invoice_id).state == "RECOVERED" and len(sim.successful_charges(invoice_id)) == 1


def test_an_unanswered_payment_is_unknown_and_pressing_again_resends_the_same_key(sim, customer_cause):
    customer, invoice_id, cycle = failed_renewal(sim, decline="insufficient_funds")
    sim.set_card(customer, "ok")
    sim.faults.error_500("POST /v1/invoices/*/pay", apply=False)  # the request never took effect
    first = cycle_pay_now(cycle_pk=cycle.pk, cause=customer_cause)
    assert first.status == "UNKNOWN"
    unknown = cycle_of(invoice_id)
    assert unknown.state == "RETRY_SCHEDULED", "unknown is not a failure: the cycle stays"
    assert unknown.subscription.entitlement_profile != "FULL", "and not a success"
    assert unknown.pending_attempt.state == "UNKNOWN" and sim.successful_charges(invoice_id) == []

    second = cycle_pay_now(cycle_pk=cycle.pk, cause=customer_cause)
    assert second.status == "PAID", second
    (attempt,) = local_attempts(invoice_id)
    assert attempt.state == "SUCCEEDED"
    assert charged_keys(sim, invoice_id) == [attempt.idempotency_key], "the same key, one charge"


def test_a_lost_answer_after_the_charge_is_resolved_by_asking_not_by_paying_again(sim, customer_cause):
    customer, invoice_id, cycle = failed_renewal(sim, decline="insufficient_funds")
    sim.set_card(customer, "ok")
    sim.faults.timeout("POST /v1/invoices/*/pay", apply=True, hold_seconds=3.0)  # charged; answer lost
    assert cycle_pay_now(cycle_pk=cycle.pk, cause=customer_cause).status == "UNKNOWN"
    assert len(sim.successful_charges(invoice_id)) == 1
    assert cycle_of(invoice_id).subscription.entitlement_profile != "FULL"
    assert cycle_pay_now(cycle_pk=cycle.pk, cause=customer_cause).status == "PAID"
    assert cycle_of(invoice_id).state == "RECOVERED"
    assert len(sim.successful_charges(invoice_id)) == 1 and len(local_attempts(invoice_id)) == 1


def test_a_payment_detached_by_the_providers_failure_event_is_resolved_before_any_new_one(sim, customer_cause):
    customer, invoice_id, cycle = failed_renewal(sim, decline="insufficient_funds")
    sim.faults.timeout("POST /v1/invoices/*/pay", apply=True, hold_seconds=3.0)  # declined; answer lost
    assert cycle_pay_now(cycle_pk=cycle.pk, cause=customer_cause).status == "UNKNOWN"
    sim.deliver_all()  # the provider's own events about that decline: a failed retry, which detaches it
    detached = cycle_of(invoice_id)
    assert detached.pending_attempt is None
    assert [a.state for a in local_attempts(invoice_id)] == ["UNKNOWN"]
    assert accept(detached, "dispatch_customer_payment", cause=customer_cause).reason == "ATTEMPT_PENDING"

    again = cycle_pay_now(cycle_pk=cycle.pk, cause=customer_cause)  # asks under the same key first
    assert (again.status, again.detail) == ("DECLINED", "insufficient_funds")
    assert [a.state for a in local_attempts(invoice_id)] == ["FAILED"]
    sim.set_card(customer, "ok")
    assert cycle_pay_now(cycle_pk=cycle.pk, cause=customer_cause).status == "PAID"
    first, second = local_attempts(invoice_id)
    assert charged_keys(sim, invoice_id) == [second.idempotency_key] and first.state == "FAILED"


def test_pay_now_is_refused_in_plain_words_while_a_payment_is_in_flight(sim, customer_cause):
    customer, invoice_id, cycle = failed_renewal(sim, decline="insufficient_funds")
    sim.set_card(customer, "ok")
    assert accept(cycle, "dispatch_customer_payment", cause=customer_cause).accepted  # on its way
    again = cycle_pay_now(cycle_pk=cycle.pk, cause=customer_cause)
    assert (again.status, again.code) == ("REFUSED", "ATTEMPT_IN_PROGRESS")
    assert "not charge you again" in again.detail
    assert sim.successful_charges(invoice_id) == [] and len(local_attempts(invoice_id)) == 1


def test_declines_are_recorded_on_the_attempt_and_a_hard_one_asks_for_a_new_card(sim, customer_cause):
    customer, invoice_id, cycle = failed_renewal(sim, decline="insufficient_funds")
    soft = cycle_pay_now(cycle_pk=cycle.pk, cause=customer_cause)
    assert (soft.status, soft.detail) == ("DECLINED", "insufficient_funds")
    after_soft = cycle_of(invoice_id)
    assert after_soft.state == "RETRY_SCHEDULED" and after_soft.pending_attempt is None
    assert pay_now_blocker(after_soft) is None, "a soft decline may be paid again"

    sim.set_card(customer, "stolen_card")
    hard = cycle_pay_now(cycle_pk=cycle.pk, cause=customer_cause)
    assert (hard.status, hard.detail) == ("DECLINED", "stolen_card")
    after_hard = cycle_of(invoice_id)
    assert after_hard.customer_action_required and pay_now_blocker(after_hard) == "NON_RETRYABLE_NO_RETRY"
    refused = cycle_pay_now(cycle_pk=cycle.pk, cause=customer_cause)
    assert (refused.status, refused.code) == ("REFUSED", "NON_RETRYABLE_NO_RETRY")
    assert [(a.state, a.decline_code) for a in local_attempts(invoice_id)] == [
        ("FAILED", "insufficient_funds"), ("FAILED", "stolen_card")]
    assert [a.idempotency_key for a in local_attempts(invoice_id)] == [
        local_idempotency_key(cycle.cycle_id, 2), local_idempotency_key(cycle.cycle_id, 3)]
    assert sim.successful_charges(invoice_id) == []


def test_a_restricted_customer_pays_now_and_gets_full_access(sim, customer_cause, time_machine):
    time_machine.move_to("2026-12-01T09:00:00Z", tick=True)
    customer, invoice_id, cycle = failed_renewal(sim, decline="insufficient_funds")
    time_machine.move_to(cycle.grace_expires_at + timedelta(minutes=1), tick=True)
    job_run("grace_expiry")
    restricted = cycle_of(invoice_id)
    assert restricted.state == "RESTRICTED" and restricted.subscription.entitlement_profile == "SUSPENDED"
    sim.set_card(customer, "ok")
    assert cycle_pay_now(cycle_pk=cycle.pk, cause=customer_cause).status == "PAID"
    recovered = cycle_of(invoice_id)
    assert recovered.state == "RECOVERED" and recovered.subscription.entitlement_profile == "FULL"


def test_pay_now_is_not_for_local_retry_authority(sim, customer_cause):
    _, invoice_id, cycle = failed_renewal(sim, price="price_monthly_local", decline="insufficient_funds")
    outcome = cycle_pay_now(cycle_pk=cycle.pk, cause=customer_cause)
    assert (outcome.status, outcome.code) == ("REFUSED", "RETRY_AUTHORITY_IS_LOCAL")
    assert local_attempts(invoice_id) == []


# --- the page and the emails ----------------------------------------------------------------------

def test_the_page_offers_only_what_can_work_and_names_the_plan(sim, client, payer):
    customer, invoice_id, cycle = failed_renewal(sim, decline="stolen_card")
    link_login(payer, cycle.subscription)
    client.force_login(payer)
    page = reverse("billing-subscription", args=[cycle.subscription.pk])
    declined = client.get(page).content.decode()
    assert "Your Pro plan" in declined and "price_monthly_pro" not in declined
    assert "not to try this card again" in declined and "Update payment method" in declined
    assert cycle.invoice.hosted_invoice_url in declined
    assert "Pay $49.00 now" not in declined and "Retry payment now" not in declined
    assert_plain(declined)

    sim.update_payment_method(customer, "ok")
    sim.deliver_all()
    ready = client.get(page).content.decode()
    assert "Pay $49.00 now" in ready and "not to try this card again" not in ready
    pay = reverse("billing-pay-now", args=[cycle.subscription.pk, cycle.pk])
    done = client.post(pay, follow=True).content.decode()
    assert "Thank you: your payment went through." in done
    assert "Full access. Thank you, everything is paid." in done and "Nothing to pay" in done
    assert_plain(done)
    assert len(sim.successful_charges(invoice_id)) == 1


def test_the_page_says_a_payment_is_on_its_way_and_offers_to_ask_when_unanswered(sim, client, payer,
                                                                                customer_cause):
    customer, invoice_id, cycle = failed_renewal(sim, decline="insufficient_funds")
    link_login(payer, cycle.subscription)
    client.force_login(payer)
    page = reverse("billing-subscription", args=[cycle.subscription.pk])
    sim.set_card(customer, "ok")
    sim.faults.error_500("POST /v1/invoices/*/pay", apply=False)
    assert cycle_pay_now(cycle_pk=cycle.pk, cause=customer_cause).status == "UNKNOWN"
    unanswered = client.get(page).content.decode()
    assert "not had an answer from your bank" in unanswered and "Check on my payment" in unanswered
    assert "Pay $49.00 now" not in unanswered
    done = client.post(reverse("billing-pay-now", args=[cycle.subscription.pk, cycle.pk]), follow=True)
    assert "Thank you: your payment went through." in done.content.decode()
    assert len(sim.successful_charges(invoice_id)) == 1


def test_customer_emails_name_the_product_never_the_price_id(sim, mailoutbox):
    failed_renewal(sim, decline="stolen_card")
    job_run("outbox_relay")
    assert mailoutbox, "the payment-failed email was sent"
    for message in mailoutbox:
        text = f"{message.subject}\n{message.body}"
        assert "price_" not in text, text
    assert any("your Pro subscription" in m.body for m in mailoutbox)


# --- in Chromium ----------------------------------------------------------------------------------

@pytest.fixture
def live_sim(settings, shipped_policies, live_server):
    """The simulator posting its webhooks to the live server as they happen (as Stripe would)."""
    from tests.verification.fake_stripe import StripeSimulator

    simulator = StripeSimulator(account="acct_demo", webhook_secrets=["whsec_local"],
                                sink=f"{live_server.url}/webhooks/stripe/", auto_deliver=True, webhook_timeout=20)
    settings.STRIPE_API_BASE = simulator.start()
    settings.STRIPE_WEBHOOK_SECRETS = ["whsec_local"]
    settings.STRIPE_ACCOUNT = "acct_demo"
    settings.STRIPE_API_VERSION = ""
    yield simulator
    simulator.stop()


@pytest.mark.django_db(transaction=True)
def test_a_hard_declined_customer_saves_a_new_card_presses_pay_now_and_gets_full_access(
        live_sim, live_server, new_page, django_user_model):
    _, invoice_id, cycle = failed_renewal(live_sim, decline="stolen_card")
    assert cycle.customer_action_required
    user = django_user_model.objects.create_user("worried", password=PASSWORD)
    link_login(user, cycle.subscription)

    page = new_page(mobile=True)
    page.goto(f"{live_server.url}{reverse('billing-login')}")
    page.fill("#id_username", "worried")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_selector("#access-text")
    assert "not to try this card again" in page.locator("#invoice-1-notice").inner_text()
    assert page.locator("#invoice-1-pay").count() == 0, "no button that cannot work"
    assert "price_monthly_pro" not in page.content()
    screenshot(page, "pay_now_1_card_declined")

    page.click("#invoice-1-update-card")  # the provider's hosted page (the simulator's)
    page.wait_for_selector("#save-card")
    page.click("#save-card")
    page.wait_for_selector("#hosted-note")
    screenshot(page, "pay_now_2_provider_saved_card")
    assert not cycle_of(invoice_id).customer_action_required, "the provider's events cleared it"

    page.goto(f"{live_server.url}{reverse('billing-subscription', args=[cycle.subscription.pk])}")
    pay = page.locator("#invoice-1-pay")
    assert pay.inner_text() == "Pay $49.00 now"
    screenshot(page, "pay_now_3_ready_to_pay")
    pay.click()
    page.wait_for_selector(".messages li.success")
    assert "Thank you: your payment went through." in page.locator(".messages").inner_text()
    assert page.locator("#access-text").inner_text() == "Full access. Thank you, everything is paid."
    screenshot(page, "pay_now_4_paid_full_access")

    paid = cycle_of(invoice_id)
    assert paid.state == "RECOVERED" and paid.subscription.entitlement_profile == "FULL"
    (attempt,) = local_attempts(invoice_id)
    assert charged_keys(live_sim, invoice_id) == [attempt.idempotency_key]
