"""Builders that read like the domain: policies, subscriptions, cycles, receipts, transitions."""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import time_machine
from django.utils import timezone

from dunning.acceptance.inputs import Cause, Evidence, Expect, FactSpec, InvoiceUpdate, TransitionResult
from dunning.acceptance.opening import InvoiceFacts, cycle_open_for_invoice, subscription_register
from dunning.acceptance.transitions import cycle_accept_transition
from dunning.clock import trusted_now
from dunning.evidence.receipts import receipt_record
from dunning.models import DunningCycle, DunningPolicy, ProviderReceipt
from dunning.policy.publishing import policy_publish
from subscriptions.models import Customer, Subscription

_seq = itertools.count(1)

BASE_POLICY: dict[str, Any] = {
    "schema": "subscription.dunningPolicy.v1",
    "policy": "test-monthly@1",
    "provider": {"name": "stripe", "account": "acct_test"},
    "applies_to": {"prices": ["price_test"], "cohort": "default"},
    "invoice_status_mapping": {"open": "BLOCKING", "uncollectible": "BLOCKING", "void": "CLOSED", "paid": "CLOSED"},
    "dispute_lost": "BLOCKING",
    "retryAuthority": "PAYMENT_PROVIDER",
    "maxAttempts": 4,
    "failure_classes": {"insufficient_funds": "RETRYABLE", "expired_card": "CUSTOMER_ACTION",
                        "stolen_card": "NON_RETRYABLE"},
    "grace": {"starts": "FIRST_FAILURE", "duration": "P7D", "profile": "READ_EXPORT_NO_NEW_JOBS"},
    "restrictAfter": "GRACE_EXPIRED_AND_INVOICE_OPEN",
    "restricted_profile": "SUSPENDED",
    "recoverOn": "INVOICE_PAID_RECEIPT",
    "recover_with_remaining_debt": False,
    "cancelAfter": "MANUAL_OR_POLICY_TERMINAL",
    "cancel_after_restricted": "P30D",
    "notifications": {"template_generation": 3, "reminders_before_grace_end": ["P3D", "P1D"]},
    "exceptions": {"max_duration": "P14D", "requires": ["owner", "reason", "ticket"]},
    "clock": "DATABASE",
    "mode": "ENFORCE",
    "rollout": {"percent": 100, "cohort": "default"},
}


def policy_document(**overrides: Any) -> dict[str, Any]:
    doc = copy.deepcopy(BASE_POLICY)
    for key, value in overrides.items():
        if value is None:
            doc.pop(key, None)
        else:
            doc[key] = value
    return doc


def make_policy(**overrides: Any) -> DunningPolicy:
    policy, _ = policy_publish(text=json.dumps(policy_document(**overrides)))
    return policy


def local_policy(**overrides: Any) -> DunningPolicy:
    base = {"policy": "test-local@1", "retryAuthority": "LOCAL", "retry_intervals": ["PT15M", "PT6H", "P1D"],
            "applies_to": {"prices": ["price_local"], "cohort": "default"}}
    base.update(overrides)
    return make_policy(**base)


def make_subscription(*, price: str = "price_test", email: str | None = None, now: datetime | None = None,
                      provider: str = "stripe", provider_account: str = "acct_test",
                      provider_subscription_id: str | None = None, cohort: str = "default") -> Subscription:
    """A registered subscription (Stripe on acct_test unless told). An Alipay one:
    provider="alipay", provider_account="2021000000000001", provider_subscription_id="2021560300…"."""
    n = next(_seq)
    customer = Customer.objects.create(email=email or f"customer{n}@example.com", provider=provider,
                                       provider_customer_id=f"cus_{n}" if provider == "stripe" else f"2088{n:012d}")
    return subscription_register(
        customer=customer, provider_account=provider_account,
        provider_subscription_id=provider_subscription_id or f"sub_{n}", price_id=price,
        cohort=cohort, cause=Cause.system("test"), now=now,
    )


def open_cycle(subscription: Subscription, *, amount: int = 2500, currency: str = "usd",
               now: datetime | None = None, provider_invoice_id: str | None = None) -> DunningCycle:
    n = next(_seq)
    return cycle_open_for_invoice(
        subscription_pk=subscription.pk,
        invoice=InvoiceFacts(provider_invoice_id=provider_invoice_id or f"in_{n}", amount_due=amount,
                             currency=currency, attempt_count=0),
        cause=Cause.system("test"), now=now,
    )


def reload(cycle: DunningCycle) -> DunningCycle:
    return DunningCycle.objects.select_related("invoice", "subscription", "policy", "pending_attempt").get(pk=cycle.pk)


def invoice_receipt(cycle: DunningCycle, status: str, *, fetched_at: datetime | None = None,
                    amount: int | None = None) -> ProviderReceipt:
    invoice = cycle.invoice
    body = {"id": invoice.provider_invoice_id, "object": "invoice", "status": status,
            "amount_due": amount if amount is not None else invoice.amount_due, "currency": invoice.currency}
    return receipt_record(object_type="invoice", body=body, invoice=invoice, account="acct_test",
                          fetched_at=fetched_at)


def paid_evidence(cycle: DunningCycle, *, now: datetime | None = None) -> Evidence:
    now = now or trusted_now()
    receipt = invoice_receipt(cycle, "paid", fetched_at=now)
    inv = cycle.invoice
    return Evidence(
        receipt=receipt,
        invoice=InvoiceUpdate(status="paid", amount_due=inv.amount_due, amount_paid=inv.amount_due,
                              attempt_count=max(inv.attempt_count, 1), next_payment_attempt=None),
        facts=(FactSpec(kind="PAYMENT_SUCCEEDED", amount=inv.amount_due, currency=inv.currency,
                        dedupe_key=f"paid:{inv.provider_invoice_id}", occurred_at=now),),
    )


def unpaid_evidence(cycle: DunningCycle, *, now: datetime | None = None, status: str = "open") -> Evidence:
    return Evidence(receipt=invoice_receipt(cycle, status, fetched_at=now or trusted_now()))


@contextmanager
def clock_reaches(now: datetime | None) -> Iterator[None]:
    """A test that names a later `now` means that moment has come: the trusted clock is moved
    there too (the acceptance service refuses a `now` the clock has not reached)."""
    if now is None or now <= timezone.now():
        yield
        return
    with time_machine.travel(now, tick=True):
        yield


def accept(cycle: DunningCycle, edge: str, *, cause: Cause | None = None, evidence: Evidence | None = None,
           now: datetime | None = None, expect: Expect | None = None, **params: Any) -> TransitionResult:
    fresh = reload(cycle)
    with clock_reaches(now):
        return cycle_accept_transition(
            cycle_pk=cycle.pk, edge=edge, expect=expect or Expect.from_cycle(fresh),
            cause=cause or Cause.system("test"), evidence=evidence, params=params, now=now,
        )


def fail_first_payment(cycle: DunningCycle, *, decline_code: str = "insufficient_funds",
                       now: datetime | None = None) -> None:
    """CURRENT → PAYMENT_FAILED → GRACE_ACTIVE, as an invoice.payment_failed would."""
    assert accept(cycle, "record_failure", decline_code=decline_code, now=now), "record_failure refused"
    assert accept(cycle, "start_grace", now=now), "start_grace refused"


def restrict(cycle: DunningCycle, *, now: datetime | None = None) -> datetime:
    """From GRACE_ACTIVE to RESTRICTED once grace has run out. Returns the time used."""
    now = now or trusted_now()
    later = reload(cycle).grace_expires_at + timedelta(seconds=1)
    later = max(later, now)
    assert accept(cycle, "expire_grace", now=later), "expire_grace refused"
    assert accept(cycle, "begin_restriction", evidence=unpaid_evidence(cycle, now=later), now=later)
    assert accept(cycle, "complete_restriction", now=later)
    return later
