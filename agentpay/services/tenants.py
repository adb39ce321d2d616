"""Setting a tenant up: the tenant and its wallet, in one transaction.

A tenant with no wallet would answer its first call with a surprise; so the wallet is made with
the tenant (empty: money comes only from a provider payment or a staff credit). A tenant made
some other way still gets a clear answer: `policy_denied` (no_wallet), a 402 `no-wallet`.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction

from agentpay.bridge import trusted_now
from agentpay.models import Tenant, TenantCustomerLink
from agentpay.services.ledger import wallet_ensure
from agentpay.services.topups import CREDIT_PERMISSION


def tenant_create(*, name: str, currency: str | None = None, subscription_ref: str = "",
                  provider_customer_ref: str = "") -> Tenant:
    """A new tenant with an empty wallet in `currency` (default AGENTPAY_DEFAULT_CURRENCY);
    `provider_customer_ref` (cus_…) is the Stripe customer whose payments top it up."""
    with transaction.atomic(durable=True):
        tenant = Tenant.objects.create(name=name, subscription_ref=subscription_ref,
                                       provider_customer_ref=provider_customer_ref)
        wallet_ensure(tenant=tenant, currency=(currency or settings.AGENTPAY_DEFAULT_CURRENCY).lower())
    return tenant


CUSTOMER_REF = re.compile(r"^cus_[A-Za-z0-9]{1,250}$")


class CustomerLinkRefused(Exception):
    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code, self.detail = code, detail


def tenant_link_provider_customer(*, tenant_id: str, customer_ref: str, user: Any, reason: str, ticket: str,
                                  now: datetime | None = None) -> TenantCustomerLink:
    """Link (or, with an empty ref, unlink) the Stripe customer whose payments top the tenant's
    wallet up when they name no tenant. Staff with `agentpay.credit_wallet` only, with a reason and
    a ticket; every change is a TenantCustomerLink row. A customer already linked to another
    tenant is refused: its payments would credit whichever tenant claimed them first."""
    customer_ref = customer_ref.strip()
    if not user.has_perm(CREDIT_PERMISSION):
        raise CustomerLinkRefused("NOT_PERMITTED", f"{user.get_username()} may not link provider customers")
    if not reason.strip() or not ticket.strip():
        raise CustomerLinkRefused("REASON_AND_TICKET_REQUIRED", "linking a customer needs a reason and a ticket")
    if customer_ref and not CUSTOMER_REF.match(customer_ref):
        raise CustomerLinkRefused("INVALID_CUSTOMER", f"a Stripe customer id looks like cus_…; got "
                                                      f"{customer_ref[:60]!r}")
    with transaction.atomic(durable=True):
        tenant = Tenant.objects.select_for_update().filter(tenant_id=tenant_id).first()
        if tenant is None:
            raise CustomerLinkRefused("NO_TENANT", f"no tenant {tenant_id[:40]!r}")
        if customer_ref:
            other = Tenant.objects.filter(provider_customer_ref=customer_ref).exclude(pk=tenant.pk).first()
            if other is not None:
                raise CustomerLinkRefused("CUSTOMER_LINKED_ELSEWHERE", f"{customer_ref} tops up {other} already; "
                                                                       f"unlink it there first")
        previous = tenant.provider_customer_ref
        if previous == customer_ref:
            raise CustomerLinkRefused("UNCHANGED", f"{tenant} is linked to {previous or 'no customer'} already")
        try:
            with transaction.atomic():
                Tenant.objects.filter(pk=tenant.pk).update(provider_customer_ref=customer_ref)
        except IntegrityError:  # a concurrent link of the same customer to another tenant won
            raise CustomerLinkRefused("CUSTOMER_LINKED_ELSEWHERE", f"{customer_ref} was just linked to another "
                                                                   f"tenant") from None
        return TenantCustomerLink.objects.create(tenant=tenant, previous_ref=previous, customer_ref=customer_ref,
                                                 actor_user=user, reason=reason.strip(), ticket=ticket.strip(),
                                                 linked_at=now or trusted_now())
