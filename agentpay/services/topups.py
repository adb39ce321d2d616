"""Money into a tenant's wallet: a staff credit (reason and ticket) or a provider payment.

Both are posted transfers from a system account, so the ledger still balances; neither touches
an intent. A provider payment credits once: its id is the transfer's unique external_ref. The
payment is always fetched from the provider when it is credited (`wallet_topup_from_provider`);
what a caller sends is only its id.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction

from agentpay.bridge import provider_payment_fetch, trusted_now
from agentpay.models import AccountKind, LedgerAccount, Tenant, Transfer
from agentpay.services.ledger import LedgerRefusal, ledger_credit_wallet

CREDIT_PERMISSION = "agentpay.credit_wallet"


def wallet_staff_credit(*, tenant: Tenant, currency: str, amount: int, user: Any, reason: str, ticket: str,
                        now: datetime | None = None) -> Transfer:
    """A billing lead credits a wallet (goodwill, a correction). Raises LedgerRefusal when refused."""
    if not user.has_perm(CREDIT_PERMISSION):
        raise LedgerRefusal("NOT_PERMITTED", f"{user.get_username()} may not credit wallets")
    if not reason.strip() or not ticket.strip():
        raise LedgerRefusal("REASON_AND_TICKET_REQUIRED", "a staff credit needs a reason and a ticket")
    with transaction.atomic(durable=True):
        return ledger_credit_wallet(tenant=tenant, currency=currency, amount=amount, source=AccountKind.STAFF_CREDIT,
                                    actor=f"user:{user.get_username()}", now=now or trusted_now(), reason=reason,
                                    ticket=ticket)


@dataclass(frozen=True)
class Topup:
    transfer: Transfer
    created: bool  # False: this payment had already been credited (a replay)


def payment_names_tenant(payment: dict[str, Any], tenant: Tenant) -> bool:
    """A payment is this tenant's when its metadata says so (`agentpay_tenant`), or, when the
    metadata names no tenant, when it was paid by the tenant's linked provider customer."""
    named = (payment.get("metadata") or {}).get("agentpay_tenant")
    if named:
        return named == tenant.tenant_id
    customer = payment.get("customer")
    customer = customer.get("id") if isinstance(customer, dict) else customer
    return bool(tenant.provider_customer_ref) and customer == tenant.provider_customer_ref


def wallet_topup_from_provider_payment(*, tenant: Tenant, payment: dict[str, Any], charge: dict[str, Any] | None = None,
                                       now: datetime | None = None) -> Topup:
    """Credit a wallet from a freshly fetched provider payment (a Stripe PaymentIntent as a dict,
    and its latest charge when it has one), once per payment id (wallet-ledger-spec §6.1).

    The caller fetches it from the provider (never from a request or webhook body). It must name
    this tenant (checked first, so nobody learns about another tenant's payment), have succeeded,
    with a paid, not fully refunded charge, in a currency the tenant has a wallet in; it is
    credited at `amount_received`. A payment already credited returns that transfer.
    Raises LedgerRefusal.
    """
    payment_id = str(payment.get("id") or "")
    if payment.get("object") != "payment_intent" or not payment_names_tenant(payment, tenant):
        raise LedgerRefusal("PAYMENT_NOT_FOR_TENANT", f"payment {payment_id} is not a top-up of {tenant.tenant_id}")
    if payment.get("status") != "succeeded":
        raise LedgerRefusal("PAYMENT_NOT_SUCCEEDED", f"payment {payment_id} is {payment.get('status')!r}")
    if charge is not None and (not charge.get("paid") or charge.get("status") != "succeeded"
                               or int(charge.get("amount_refunded") or 0) >= int(charge.get("amount") or 0)):
        raise LedgerRefusal("PAYMENT_NOT_SUCCEEDED", f"payment {payment_id}'s charge {charge.get('id')} is not paid "
                                                     f"or was refunded")
    currency, amount = str(payment.get("currency") or "").lower(), int(payment.get("amount_received") or 0)
    if not LedgerAccount.objects.filter(kind=AccountKind.WALLET, tenant=tenant, currency=currency).exists():
        raise LedgerRefusal("CURRENCY_MISMATCH", f"payment {payment_id} is in {currency!r}; "
                                                 f"{tenant.tenant_id} has no wallet in it")
    earlier = _credited(tenant, payment_id)
    if earlier is not None:
        return Topup(earlier, created=False)
    try:
        with transaction.atomic(durable=True):
            credit = ledger_credit_wallet(tenant=tenant, currency=currency, amount=amount,
                                          source=AccountKind.TOPUP_CLEARING, actor="provider:stripe",
                                          now=now or trusted_now(), reason=f"top-up from {payment_id}",
                                          external_ref=payment_id)
    except LedgerRefusal as refusal:
        earlier = _credited(tenant, payment_id) if refusal.code == "ALREADY_CREDITED" else None
        if earlier is None:
            raise
        return Topup(earlier, created=False)  # a concurrent request credited it first
    return Topup(credit, created=True)


def _credited(tenant: Tenant, payment_id: str) -> Transfer | None:
    earlier = Transfer.objects.select_related("credit_account").filter(external_ref=payment_id).first()
    if earlier is not None and earlier.credit_account.tenant_id != tenant.pk:
        raise LedgerRefusal("PAYMENT_NOT_FOR_TENANT", f"payment {payment_id} was credited to another wallet")
    return earlier


def wallet_topup_from_provider(*, tenant: Tenant, payment_id: str, now: datetime | None = None) -> Topup:
    """Fetch the PaymentIntent (and its latest charge) from the provider now, then credit it once.

    Raises ProviderUnavailable (nothing is known: nothing credited), ProviderNoSuchObject,
    ProviderRefusedRequest, or LedgerRefusal.
    """
    payment = provider_payment_fetch(payment_id)
    if payment.get("id") != payment_id:
        raise LedgerRefusal("PAYMENT_NOT_FOR_TENANT", f"the provider answered about {payment.get('id')!r}")
    latest = payment.get("latest_charge")
    latest = latest.get("id") if isinstance(latest, dict) else latest
    charge = provider_payment_fetch(latest) if latest and payment_names_tenant(payment, tenant) else None
    return wallet_topup_from_provider_payment(tenant=tenant, payment=payment, charge=charge, now=now)
