"""Outbox relay, the notification consumer and grace reminders (SPEC §10)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.core import mail

from dunning.actions.notifications import notification_deliver
from dunning.jobs.framework import job_run
from dunning.jobs.messaging import due_reminder_slot
from dunning.models import NotificationDelivery, OutboxMessage
from tests.support.builders import (
    accept,
    clock_reaches,
    fail_first_payment,
    make_policy,
    make_subscription,
    open_cycle,
    paid_evidence,
    reload,
)

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


@pytest.fixture
def failed(policy):
    sub = make_subscription(now=T0)
    cycle = open_cycle(sub, amount=2500, now=T0)
    fail_first_payment(cycle, now=T0)
    return reload(cycle)


def emails(template: str) -> list:
    return [m for m in mail.outbox if m.extra_headers.get("X-Dunning-Template", "").startswith(template)]


def notices(template: str):
    return OutboxMessage.objects.filter(topic="notification.requested", payload__template=template)


def test_relay_sends_the_payment_failed_notice_once(failed):
    run = job_run("outbox_relay", now=T0 + timedelta(seconds=5))
    (email,) = emails("payment_failed")
    assert email.to == [failed.subscription.customer.email]
    assert "25.00 USD" in email.body and "read and export only" in email.body
    assert "8 December 2026" in email.body, "the grace end in plain words"
    assert run.changed >= 1
    message = notices("payment_failed").get()
    assert message.published_at is not None
    # At-least-once: the same message handed over again sends nothing more.
    notification_deliver(message, now=T0 + timedelta(minutes=1))
    job_run("outbox_relay", now=T0 + timedelta(minutes=2))
    assert len(emails("payment_failed")) == 1
    assert NotificationDelivery.objects.get(message=message).status == "SENT"


def test_a_failing_consumer_keeps_the_message_and_backs_off(failed, monkeypatch):
    from django.core.mail import EmailMessage

    real_send = EmailMessage.send
    monkeypatch.setattr(EmailMessage, "send", lambda self, fail_silently=False: (_ for _ in ()).throw(
        ConnectionError("smtp down")))
    first = job_run("outbox_relay", now=T0)
    message = notices("payment_failed").get()
    assert first.errors == 1 and message.published_at is None and "smtp down" in message.last_error
    assert message.claimed_until > T0
    assert job_run("outbox_relay", now=T0 + timedelta(seconds=1)).examined == 0, "backing off"
    monkeypatch.setattr(EmailMessage, "send", real_send)
    job_run("outbox_relay", now=message.claimed_until)
    message.refresh_from_db()
    assert message.published_at is not None and len(emails("payment_failed")) == 1


def test_two_reminders_arrive_before_grace_ends_and_none_after(failed):
    expires = failed.grace_expires_at
    now = T0
    while now < expires + timedelta(days=2):
        reminders_at(now)
        job_run("outbox_relay", now=now)
        now += timedelta(hours=3)
    sent = NotificationDelivery.objects.filter(template="grace_reminder", status="SENT").order_by("handled_at")
    assert [d.handled_at for d in sent][:2] and len(sent) == 2
    first, second = (d.handled_at for d in sent)
    assert expires - timedelta(days=3) <= first < expires - timedelta(days=1) <= second < expires
    assert len(emails("grace_reminder")) == 2
    assert "Reminder" in emails("grace_reminder")[0].subject


def test_no_reminder_after_recovery_even_if_queued_before(failed):
    expires = failed.grace_expires_at
    reminders_at(expires - timedelta(days=3) + timedelta(minutes=1))
    assert notices("grace_reminder").count() == 1
    assert accept(failed, "recover", evidence=paid_evidence(failed)).accepted
    job_run("outbox_relay", now=expires - timedelta(days=2))
    assert emails("grace_reminder") == []
    skipped = NotificationDelivery.objects.get(template="grace_reminder")
    assert skipped.status == "SKIPPED" and "RECOVERED" in skipped.reason
    assert len(emails("payment_recovered")) == 1
    reminders_at(expires - timedelta(hours=12))
    assert notices("grace_reminder").count() == 1, "a recovered cycle gets no new reminder"


def test_after_an_outage_only_the_latest_due_reminder_is_sent(failed):
    expires = failed.grace_expires_at
    reminders_at(expires - timedelta(hours=12))
    reminders_at(expires - timedelta(hours=11))
    assert list(notices("grace_reminder").values_list("payload__slot", flat=True)) == [1]


def test_reminder_slot_arithmetic():
    offsets = (timedelta(days=1), timedelta(days=3))
    end = T0 + timedelta(days=7)
    assert due_reminder_slot(offsets, end, T0) is None
    assert due_reminder_slot(offsets, end, end - timedelta(days=3)) == 0
    assert due_reminder_slot(offsets, end, end - timedelta(hours=1)) == 1
    assert due_reminder_slot(offsets, end, end) is None, "nothing at or after grace end"


def test_shadow_policy_sends_nothing(db):
    make_policy(policy="shadow@1", mode="SHADOW", applies_to={"prices": ["price_shadow"], "cohort": "default"})
    sub = make_subscription(price="price_shadow", now=T0)
    cycle = open_cycle(sub, now=T0)
    fail_first_payment(cycle, now=T0)
    reminders_at(reload(cycle).grace_expires_at - timedelta(hours=1))
    job_run("outbox_relay", now=T0 + timedelta(days=7))
    assert not OutboxMessage.objects.filter(topic="notification.requested").exists()
    assert mail.outbox == []
    assert reload(cycle).subscription.entitlement_profile == "FULL", "shadow decisions change no access"


def test_notify_only_policy_messages_without_changing_access(db):
    make_policy(policy="notify@1", mode="NOTIFY_ONLY", applies_to={"prices": ["price_notify"], "cohort": "default"})
    sub = make_subscription(price="price_notify", now=T0)
    cycle = open_cycle(sub, now=T0)
    fail_first_payment(cycle, now=T0)
    job_run("outbox_relay", now=T0)
    assert len(emails("payment_failed")) == 1
    assert reload(cycle).subscription.entitlement_profile == "FULL"


def test_duplicate_failure_webhook_sends_no_second_notice(sim):
    from tests.support.scenarios import cycle_of, failed_renewal

    customer, invoice_id, _ = failed_renewal(sim, deliver=False)
    failure_events = [e["id"] for e in sim.pending_events() if e["type"] == "invoice.payment_failed"]
    sim.deliver_all()
    cycle = cycle_of(invoice_id)
    sim.deliver(failure_events[0], duplicate=2)
    assert notices("payment_failed").filter(payload__cycle=str(cycle.cycle_id)).count() == 1
    sim.set_card(customer, "ok")
    sim.customer_pays(invoice_id)
    sim.deliver_all()
    sim.deliver(failure_events[0])  # a late duplicate after recovery
    assert notices("payment_failed").filter(payload__cycle=str(cycle.cycle_id)).count() == 1
    assert reload(cycle).state == "RECOVERED"


def reminders_at(now):
    """The reminders job at `now`, with the trusted clock there too: it refuses a `now` ahead of
    the clock (a catch-up may look back, never forward)."""
    with clock_reaches(now):
        return job_run("reminders", now=now)
