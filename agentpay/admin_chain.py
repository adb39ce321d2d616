"""The on-chain rail's records in the admin, read-only (issue 18): the networks, the 402s we sent,
the authorizations payers signed, and every transaction we signed with its broadcast and query
bookkeeping — what an engineer on call reads to see where a payment is on chain."""

from __future__ import annotations

from django.contrib import admin

from agentpay.admin_base import ReadOnlyAdmin
from agentpay.models import (
    ChainAuthorization,
    ChainNetwork,
    ChainTransaction,
    PaymentChallenge,
    SettlementAuditFinding,
)


@admin.register(ChainNetwork)
class ChainNetworkAdmin(ReadOnlyAdmin):
    list_display = ("caip2", "name", "token_name", "token_address", "confirmations", "pay_to", "submitter", "active")
    list_filter = ("active",)


@admin.register(PaymentChallenge)
class PaymentChallengeAdmin(ReadOnlyAdmin):
    list_display = ("challenge_id", "intent", "network", "amount", "issued_at", "expires_at")
    list_select_related = ("intent", "network")
    search_fields = ("challenge_id", "intent__intent_id")
    show_full_result_count = False


@admin.register(ChainAuthorization)
class ChainAuthorizationAdmin(ReadOnlyAdmin):
    list_display = ("intent", "payer", "value", "nonce", "valid_before", "received_at")
    list_select_related = ("intent",)
    search_fields = ("intent__intent_id", "payer", "nonce")
    show_full_result_count = False


@admin.register(ChainTransaction)
class ChainTransactionAdmin(ReadOnlyAdmin):
    list_display = ("tx_id", "purpose", "owner", "tx_hash", "sender_nonce", "broadcast_attempts", "block_number",
                    "receipt_status", "queries", "last_query_at")
    list_filter = ("purpose", "receipt_status")
    list_select_related = ("settlement__intent", "refund")
    search_fields = ("tx_id", "tx_hash", "settlement__intent__intent_id", "refund__refund_id", "sender")
    show_full_result_count = False

    @admin.display(description="for")
    def owner(self, tx: ChainTransaction) -> str:
        return tx.settlement.intent.intent_id if tx.settlement_id else tx.refund.refund_id


@admin.register(SettlementAuditFinding)
class SettlementAuditFindingAdmin(ReadOnlyAdmin):
    """What the confirmed audit found (agentpay.chain.audit): a confirmed transaction of ours the
    chain no longer shows where it was. The line stays confirmed; these rows say what happened."""

    list_display = ("found_at", "transaction", "owner", "evidence_kind", "action", "needs_review", "detail")
    list_filter = ("needs_review", "evidence_kind", "action")
    list_select_related = ("transaction__settlement__intent", "transaction__refund")
    search_fields = ("transaction__tx_hash", "transaction__settlement__intent__intent_id",
                     "transaction__refund__refund_id")
    show_full_result_count = False

    @admin.display(description="for")
    def owner(self, finding: SettlementAuditFinding) -> str:
        tx = finding.transaction
        return tx.settlement.intent.intent_id if tx.settlement_id else tx.refund.refund_id
