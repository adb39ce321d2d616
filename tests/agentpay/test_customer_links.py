"""Staff link a tenant to the Stripe customer whose payments top its wallet up (issue 17
leftover): billing leads only, with a reason and a ticket, one tenant per customer, every change
kept; and the admin page that does it."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.db.utils import ProgrammingError
from django.urls import reverse

from agentpay.models import Tenant, TenantCustomerLink
from agentpay.models.append_only import AppendOnlyViolation
from agentpay.services.tenants import CustomerLinkRefused, tenant_link_provider_customer
from agentpay.services.topups import payment_names_tenant
from tests.support.actors import AGENTS, make_user, role

pytestmark = pytest.mark.django_db


@pytest.fixture
def agent(db):
    user = make_user("agent", staff=True)
    user.groups.add(role(AGENTS, app_label="agentpay", codenames=["view_tenant"]))
    return user


def link(tenant, ref, user, reason="customer asked", ticket="SUP-9"):
    return tenant_link_provider_customer(tenant_id=tenant.tenant_id, customer_ref=ref, user=user, reason=reason,
                                         ticket=ticket)


def test_a_lead_links_and_relinks_and_every_change_is_kept(tenant, lead):
    first = link(tenant, "cus_A1", lead)
    second = link(tenant, "cus_B2", lead, reason="merged accounts", ticket="SUP-10")
    tenant.refresh_from_db()
    assert tenant.provider_customer_ref == "cus_B2"
    assert payment_names_tenant({"customer": "cus_B2", "metadata": {}}, tenant)
    assert not payment_names_tenant({"customer": "cus_A1", "metadata": {}}, tenant)
    assert [(r.previous_ref, r.customer_ref, r.ticket) for r in (first, second)] == [("", "cus_A1", "SUP-9"),
                                                                                     ("cus_A1", "cus_B2", "SUP-10")]
    link(tenant, "", lead, reason="customer left", ticket="SUP-11")
    tenant.refresh_from_db()
    assert tenant.provider_customer_ref == "" and TenantCustomerLink.objects.filter(tenant=tenant).count() == 3


@pytest.mark.parametrize(("ref", "reason", "ticket", "code"), [
    ("cus_ok", "", "SUP-1", "REASON_AND_TICKET_REQUIRED"),
    ("cus_ok", "why", " ", "REASON_AND_TICKET_REQUIRED"),
    ("acct_123", "why", "SUP-1", "INVALID_CUSTOMER"),
    ("cus_a b", "why", "SUP-1", "INVALID_CUSTOMER"),
    ("", "why", "SUP-1", "UNCHANGED"),
])
def test_bad_links_are_refused_and_nothing_changes(tenant, lead, ref, reason, ticket, code):
    with pytest.raises(CustomerLinkRefused) as refused:
        link(tenant, ref, lead, reason=reason, ticket=ticket)
    assert refused.value.code == code
    assert not TenantCustomerLink.objects.exists()


def test_one_customer_tops_up_one_tenant(tenant, lead):
    other = Tenant.objects.create(name="Other agents")
    link(other, "cus_shared", lead)
    with pytest.raises(CustomerLinkRefused) as refused:
        link(tenant, "cus_shared", lead)
    assert refused.value.code == "CUSTOMER_LINKED_ELSEWHERE" and "Other agents" in refused.value.detail
    tenant.refresh_from_db()
    assert tenant.provider_customer_ref == ""


def test_someone_without_the_permission_cannot_link(tenant, agent):
    with pytest.raises(CustomerLinkRefused) as refused:
        link(tenant, "cus_A1", agent)
    assert refused.value.code == "NOT_PERMITTED"


def test_a_link_row_cannot_be_rewritten(tenant, lead):
    row = link(tenant, "cus_A1", lead)
    row.reason = "edited"
    with pytest.raises(AppendOnlyViolation):
        row.save()
    with pytest.raises(ProgrammingError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE agentpay_tenantcustomerlink SET reason = 'edited' WHERE id = %s", [row.pk])


def test_the_admin_page_links_a_customer_for_a_lead_only(tenant, lead, agent, client):
    url = reverse("admin:agentpay_tenant_link_customer", args=[tenant.pk])
    change = reverse("admin:agentpay_tenant_change", args=[tenant.pk])
    client.force_login(agent)
    assert "Link Stripe customer" not in client.get(change).content.decode()
    assert client.post(url, {"customer_ref": "cus_A1", "reason": "r", "ticket": "T"}).status_code == 403
    client.force_login(lead)
    assert "Link Stripe customer" in client.get(change).content.decode()
    refused = client.post(url, {"customer_ref": "acct_1", "reason": "r", "ticket": "T"})
    assert refused.status_code == 200 and "INVALID_CUSTOMER" in refused.content.decode()
    assert client.post(url, {"customer_ref": "cus_A1", "reason": "asked by phone", "ticket": "SUP-3"}
                       ).status_code == 302
    page = client.get(change).content.decode()
    assert "cus_A1" in page and "asked by phone" in page and "SUP-3" in page
