"""The contract line's intake: a provider subscription seen for the first time is imported; one
already known is brought to what a fresh fetch shows, through the subscription's acceptance.

The event body never says what the contract is: the caller fetched the subscription moments
ago, and the fetch time fences older reads out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from dunning.acceptance.inputs import Cause, ContractUpdate, Evidence, TransitionResult
from dunning.acceptance.opening import OpeningRefused, subscription_register
from dunning.acceptance.subscription import subscription_accept_change
from dunning.clock import trusted_now
from dunning.evidence.receipts import receipt_record
from dunning.models import ProviderEvent
from dunning.refusals import CodedRefusal
from subscriptions.models import Customer, Subscription
from subscriptions.providers.base import PaymentProvider, ProviderError, ProviderSubscription
from subscriptions.providers.registry import get_provider

# A concurrent acceptance moved the revision between our read and our write: read and ask again.
CONTRACT_CAS_TRIES = 3


class ContractRefused(CodedRefusal):
    """The contract read cannot be applied (unknown status, no policy for its price, an older
    read than the one applied). `code` names why; the caller quarantines or notes it."""

    code_in_message = True


@dataclass(frozen=True)
class ContractIntake:
    subscription: Subscription
    created: bool
    result: TransitionResult | None = None  # the contract_update's outcome for a known subscription
    changed: bool = False  # the contract (or the access it allows) moved


def subscription_import(remote: ProviderSubscription, *, cause: Cause, now: datetime,
                        fetched_at: datetime | None = None, event: ProviderEvent | None = None,
                        provider: PaymentProvider | None = None) -> ContractIntake:
    """Import or update the contract from a fresh fetch (`fetched_at`: when it was fetched)."""
    fetched_at = fetched_at or trusted_now()
    existing = Subscription.objects.filter(provider=remote.provider, provider_subscription_id=remote.id).first()
    update = ContractUpdate.from_provider(remote, fetched_at=fetched_at)
    if remote.price_ids and (existing is None or not existing.plan_name or existing.price_id != remote.price_ids[0]):
        update = replace(update, plan_name=_product_name(remote.price_ids[0], provider, remote.provider))
    receipt = receipt_record(object_type="subscription", body=remote.raw or {"id": remote.id, "status": remote.status},
                             account=remote.account, fetched_at=fetched_at, cause_event=event,
                             provider=remote.provider)
    if existing is None:
        return _register(remote, update, cause, now)
    result: TransitionResult | None = None
    revision_before = existing.contract_revision
    for _ in range(CONTRACT_CAS_TRIES):
        result = subscription_accept_change(
            subscription_pk=existing.pk, change="contract_update", cause=cause,
            expect_contract_revision=existing.contract_revision, contract=update,
            evidence=Evidence(receipt=receipt), now=now,
        )
        if result.accepted or result.reason != "STALE_CONTRACT_REVISION":
            break
        existing.refresh_from_db()
    if result is not None and not result.accepted and result.reason in ("UNKNOWN_CONTRACT_STATUS",
                                                                          "NO_POLICY_FOR_PRICE"):
        raise ContractRefused(result.reason, result.detail)
    existing.refresh_from_db()
    changed = bool(result and result.accepted and (result.snapshot_issued or
                                                   existing.contract_revision != revision_before))
    return ContractIntake(existing, False, result, changed)


def _product_name(price_id: str, provider: PaymentProvider | None, remote_provider: str) -> str:
    """What customers call the plan (pages and emails never show a price id). Asked once per plan
    read, not per page; a provider that cannot say leaves the name on record."""
    try:
        return (provider or get_provider(remote_provider)).fetch_price(price_id).product_name.strip()[:255]
    except ProviderError:
        return ""


def _register(remote: ProviderSubscription, update: ContractUpdate, cause: Cause, now: datetime) -> ContractIntake:
    customer, _ = Customer.objects.get_or_create(
        provider=remote.provider, provider_customer_id=remote.customer_id,
        defaults={"email": remote.customer_email or f"{remote.customer_id}@unknown.invalid"},
    )
    try:
        sub = subscription_register(
            customer=customer, provider_account=remote.account, provider_subscription_id=remote.id,
            price_id=remote.price_ids[0] if remote.price_ids else "", cause=cause, now=now,
            billing_interval="year" if remote.interval == "year" else "month", contract=update,
        )
    except OpeningRefused as refused:
        raise ContractRefused(refused.code, refused.detail) from None
    return ContractIntake(sub, True, changed=True)
