"""Amounts past 32 bits. The totals are bigint columns. Left to Django, the `amount` of
`F(total) + amount` is an Int4, which psycopg's server-side binding (DB_SERVER_SIDE_BINDING=1)
wraps past 2**31: the bench's 10**12-unit wallet float once arrived as -727379968 (a CHECK
violation). Runs in whichever binding mode the suite has."""

from __future__ import annotations

import pytest

from agentpay.models import AccountKind, LedgerAccount
from agentpay.services.topups import wallet_staff_credit

pytestmark = pytest.mark.django_db

BIG = 10**12


def test_credits_past_32_bits_add_up_on_the_wallet_and_the_system_account(tenant, lead):
    for ticket in ("T-1", "T-2", "T-3"):
        wallet_staff_credit(tenant=tenant, currency="usd", amount=BIG, user=lead, reason="float", ticket=ticket)
    wallet = LedgerAccount.objects.get(kind=AccountKind.WALLET, tenant=tenant, currency="usd")
    staff = LedgerAccount.objects.get(kind=AccountKind.STAFF_CREDIT, currency="usd")
    assert (wallet.credits_posted, staff.debits_posted) == (3 * BIG, 3 * BIG)
