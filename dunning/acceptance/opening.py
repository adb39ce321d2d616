"""Acceptance entry points that create rows: a subscription's registration (its first snapshot)
and a renewal invoice's cycle. They share the settle step with `cycle_accept_transition`, so
the root, the receipt and the outbox are written exactly as for any other transition."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import IntegrityError, transaction

from dunning.acceptance.aggregate import EMPTY_ROOT
from dunning.acceptance.contract import ContractView, contract_phase, is_ended
from dunning.acceptance.inputs import Cause, ContractUpdate, Evidence
from dunning.acceptance.settlement import Accepted, settle_subscription
from dunning.clock import trusted_now
from dunning.models import DunningCycle, DunningPolicy
from dunning.policy.publishing import NoPolicyError, policy_for_prices
from dunning.policy.vocabulary import CONTRACT_STATES
from dunning.refusals import CodedRefusal
from dunning.states import CycleState
from entitlements.profiles import FULL
from subscriptions.models import Customer, Invoice, Subscription


class OpeningRefused(CodedRefusal, ValueError):
    """The row cannot be opened; `code` says why (the caller quarantines with that reason)."""

    code_in_message = True


def subscription_register(
    *,
    customer: Customer,
    provider_account: str,
    provider_subscription_id: str,
    price_id: str,
    cause: Cause,
    cohort: str = "default",
    billing_interval: str = "month",
    provider_status: str = "active",
    contract: ContractUpdate | None = None,
    now: datetime | None = None,
) -> Subscription:
    """Import a subscription, bind its policy and issue its first snapshot (generation 1: FULL,
    or what an already ended or paused contract allows). Idempotent."""
    now = now or trusted_now()
    existing = Subscription.objects.filter(provider=customer.provider,
                                           provider_subscription_id=provider_subscription_id).first()
    if existing is not None:
        return existing
    status = contract.status if contract else provider_status
    if status not in CONTRACT_STATES:
        raise OpeningRefused("UNKNOWN_CONTRACT_STATUS", f"provider status {status!r} is not a contract state we know")
    try:
        policy = policy_for_prices(contract.price_ids if contract and contract.price_ids else (price_id,),
                                   cohort=cohort, provider=customer.provider, account=provider_account)
    except NoPolicyError as exc:
        raise OpeningRefused("NO_POLICY_FOR_PRICE", str(exc)) from None
    mirror = _contract_fields(contract) if contract else {"provider_status": provider_status}
    try:
        with transaction.atomic(durable=True):
            subscription = Subscription.objects.create(
                customer=customer, provider=customer.provider, provider_account=provider_account,
                provider_subscription_id=provider_subscription_id, price_id=price_id, cohort=cohort,
                billing_interval=billing_interval, policy=policy, outstanding_cycle_root=EMPTY_ROOT,
                entitlement_profile=FULL, entitlement_generation=0, **mirror,
            )
            subscription = Subscription.objects.select_for_update().get(pk=subscription.pk)
            settle_subscription(
                subscription=subscription, changed_cycle=None, now=now,
                accepted=Accepted(edge="register", cause=cause, evidence=Evidence(),
                                  notes=(f"bound to policy {policy.identity}",)),
                force_new_generation=True, first_snapshot=True,
            )
            return subscription
    except IntegrityError:
        # A concurrent delivery registered it first; theirs stands.
        return Subscription.objects.get(provider=customer.provider, provider_subscription_id=provider_subscription_id)


def _contract_fields(contract: ContractUpdate) -> dict[str, object]:
    return {**contract.mirror_fields(), "contract_fetched_at": contract.fetched_at, "contract_revision": 1}


@dataclass(frozen=True)
class InvoiceFacts:
    provider_invoice_id: str
    amount_due: int
    currency: str
    status: str = "open"
    amount_paid: int = 0
    attempt_count: int = 0
    next_payment_attempt: datetime | None = None
    period_start: datetime | None = None
    period_end: datetime | None = None
    hosted_invoice_url: str = ""
    price_ids: tuple[str, ...] = ()


def cycle_open_for_invoice(
    *,
    subscription_pk: int,
    invoice: InvoiceFacts,
    cause: Cause,
    evidence: Evidence | None = None,
    now: datetime | None = None,
) -> DunningCycle:
    """Mirror a renewal invoice and open its CURRENT cycle under the policy of the invoice's own
    prices (open cycles keep it when the plan moves later). Idempotent per invoice.

    Refused (OpeningRefused) on a contract that has ended: debt already open stays debt, but no
    new dunning starts on an ended contract. Also refused when no policy covers the prices."""
    now = now or trusted_now()
    if invoice.amount_due < 0:
        raise ValueError("amount_due must be a non-negative amount in minor units")
    if len(invoice.currency) != 3:
        raise ValueError(f"currency must be an ISO 4217 code, got {invoice.currency!r}")
    existing = DunningCycle.objects.filter(invoice__provider_invoice_id=invoice.provider_invoice_id).first()
    if existing is not None:
        return existing
    try:
        with transaction.atomic(durable=True):
            subscription = Subscription.objects.select_for_update().select_related("policy").get(pk=subscription_pk)
            phase = contract_phase(ContractView.of(subscription), now)
            if is_ended(phase):
                raise OpeningRefused("CONTRACT_ENDED", f"contract {subscription.provider_subscription_id} has ended "
                                                       f"({phase}); no new dunning cycle opens on it")
            policy = _policy_for_invoice(subscription, invoice.price_ids)
            mirror = Invoice.objects.create(
                provider=subscription.provider, provider_invoice_id=invoice.provider_invoice_id,
                subscription=subscription, amount_due=invoice.amount_due, amount_paid=invoice.amount_paid,
                currency=invoice.currency.lower(), status=invoice.status, attempt_count=invoice.attempt_count,
                next_payment_attempt=invoice.next_payment_attempt, period_start=invoice.period_start,
                period_end=invoice.period_end, hosted_invoice_url=invoice.hosted_invoice_url,
                price_ids=list(invoice.price_ids),
            )
            cycle = DunningCycle.objects.create(
                subscription=subscription, invoice=mirror, amount=mirror.amount_due, currency=mirror.currency,
                provider_generation=mirror.revision, policy=policy, state=CycleState.CURRENT,
                opened_at=now,
            )
            settle_subscription(
                subscription=subscription, changed_cycle=cycle, now=now,
                accepted=Accepted(edge="open_cycle", cause=cause, evidence=evidence or Evidence()),
            )
            return cycle
    except IntegrityError:
        return DunningCycle.objects.get(invoice__provider_invoice_id=invoice.provider_invoice_id)


def _policy_for_invoice(subscription: Subscription, price_ids: tuple[str, ...]) -> DunningPolicy:
    """An invoice's own prices pick its cycle's policy (a legacy price cohort maps to the right
    invoice); an invoice that names no price follows the subscription's binding."""
    if not price_ids:
        return subscription.policy
    try:
        return policy_for_prices(price_ids, cohort=subscription.cohort, provider=subscription.provider,
                                 account=subscription.provider_account)
    except NoPolicyError as exc:
        raise OpeningRefused("NO_POLICY_FOR_PRICE", str(exc)) from None
