"""The indexes a paid call's rows are written into (migration 0014): every entry costs each of the
seven receipts, two outbox rows, two transfers and the intent's three lines, so none that another
index covers, none on a column nearly every row leaves empty, and no LIKE copy of an opaque id."""

from __future__ import annotations

import pytest
from django.db import connection

pytestmark = pytest.mark.django_db

# table → the indexes every row of it is entered into (the partial ones are left out: their
# condition excludes a paid call's rows)
WRITTEN_BY_A_PAID_CALL = {
    "agentpay_intentreceipt": {"agentpay_intentreceipt_pkey", "receipt_intent_timeline"},
    "agentpay_outboxmessage": {"agentpay_outboxmessage_pkey", "agentpay_outboxmessage_dedupe_key_key",
                               "agentpay_outboxmessage_intent_id_e8223cc0"},
    "agentpay_transfer": {"agentpay_transfer_pkey", "agentpay_transfer_transfer_id_key",
                          "agentpay_transfer_credit_account_id_18e1329c", "agentpay_transfer_debit_account_id_8c34dbfc",
                          "agentpay_transfer_intent_id_d2797e5e"},
    "agentpay_paymentintent": {"agentpay_paymentintent_pkey", "agentpay_paymentintent_intent_id_key",
                               "agentpay_paymentintent_route_id_e0ff8177", "one_intent_per_tenant_key"},
    "agentpay_settlement": {"agentpay_settlement_pkey", "agentpay_settlement_settlement_id_key",
                            "agentpay_settlement_hold_id_key", "agentpay_settlement_intent_id_3eb8ed93"},
    "agentpay_fulfillment": {"agentpay_fulfillment_pkey", "agentpay_fulfillment_fulfillment_id_key",
                             "agentpay_fulfillment_intent_id_key"},
    "agentpay_gatewayrequest": {"agentpay_gatewayrequest_pkey", "agentpay_gatewayrequest_request_id_key",
                                "agentpay_gatewayrequest_intent_id_fa861247",
                                "agentpay_gatewayrequest_route_id_ceed9398",
                                "agentpay_gatewayrequest_tenant_id_cdc80fd0"},
}


def _indexes(table: str) -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s", [table])
        return dict(cursor.fetchall())


@pytest.mark.parametrize("table", sorted(WRITTEN_BY_A_PAID_CALL))
def test_a_paid_calls_rows_are_entered_only_in_the_indexes_they_need(table):
    whole = {name for name, definition in _indexes(table).items() if " WHERE " not in definition}
    assert whole == WRITTEN_BY_A_PAID_CALL[table]


def test_what_the_dropped_indexes_served_is_still_indexed():
    receipts, intents = _indexes("agentpay_intentreceipt"), _indexes("agentpay_paymentintent")
    assert "(refusal_code) WHERE" in receipts["receipt_refusals"]
    assert "(actor_user_id) WHERE (actor_user_id IS NOT NULL)" in receipts["receipt_by_person"]
    assert "(review_owner_id) WHERE (review_owner_id IS NOT NULL)" in intents["intent_by_review_owner"]
    assert "(tenant_id, idempotency_key)" in intents["one_intent_per_tenant_key"]
    assert "(pending_id) WHERE (pending_id IS NOT NULL)" in _indexes("agentpay_transfer")["hold_resolved_once"]
