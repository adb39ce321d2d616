"""Money into a tenant's wallet: a staff credit (reason and ticket) or a provider payment.

Both are posted transfers from a system account, so the ledger still balances; neither touches
an intent. A provider payment credits once: its id is the transfer's unique external_ref.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction

from agentpay.bridge import trusted_now
from agentpay.models import AccountKind, Tenant, Transfer
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


def wallet_topup_from_provider_payment(*, tenant: Tenant, payment: dict[str, Any],
                                       now: datetime | None = None) -> Transfer:
    """Credit a wallet from a freshly fetched provider payment (a Stripe PaymentIntent as a dict).

    The caller fetches it from the provider (never from a webhook body). It must have succeeded,
    name this tenant in `metadata.agentpay_tenant`, and is credited at `amount_received`, once.
    """
    if payment.get("object") != "payment_intent" or payment.get("status") != "succeeded":
        raise LedgerRefusal("PAYMENT_NOT_SUCCEEDED", f"payment {payment.get('id')} is {payment.get('status')!r}")
    if (payment.get("metadata") or {}).get("agentpay_tenant") != tenant.tenant_id:
        raise LedgerRefusal("PAYMENT_FOR_ANOTHER_TENANT", f"payment {payment.get('id')} does not name "
                                                          f"{tenant.tenant_id}")
    amount = int(payment.get("amount_received") or 0)
    with transaction.atomic(durable=True):
        return ledger_credit_wallet(tenant=tenant, currency=str(payment["currency"]).lower(), amount=amount,
                                    source=AccountKind.TOPUP_CLEARING, actor="provider:stripe",
                                    now=now or trusted_now(), reason=f"top-up from {payment['id']}",
                                    external_ref=str(payment["id"]))
