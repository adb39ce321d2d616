"""The wallet ledger: double-entry accounts and append-only transfers (TigerBeetle's model).

An account keeps four running totals. A transfer moves `amount` from its debit account to its
credit account, either posted at once or as a pending transfer (a hold, `hld_…`) that a later
transfer posts (capture) or voids (release) exactly once. Unlike TigerBeetle, a hold has no
timeout: a hold whose fulfillment is unknown must stay held until someone knows.

A tenant's wallet is credit-normal (we owe the tenant its balance):
available = credits_posted - debits_posted - debits_pending, and a CHECK keeps it ≥ 0 in the
database, whatever code runs. Every transfer adds the same amount to one debit and one credit
total, so across all accounts debits always equal credits.
"""

from __future__ import annotations

from django.db import models
from django.db.models import F, Q

from agentpay import ids
from agentpay.models.append_only import AppendOnlyModel
from agentpay.models.tenants import CURRENCY, Tenant


class AccountKind(models.TextChoices):
    WALLET = "wallet", "Tenant wallet"
    REVENUE = "revenue", "Revenue (captured calls)"
    TOPUP_CLEARING = "topup_clearing", "Top-up clearing (provider payments received)"
    STAFF_CREDIT = "staff_credit", "Staff credit (goodwill, corrections)"


SYSTEM_KINDS = (AccountKind.REVENUE, AccountKind.TOPUP_CLEARING, AccountKind.STAFF_CREDIT)


class LedgerAccount(models.Model):
    account_id = models.CharField(max_length=40, unique=True, default=ids.new_account_id)
    kind = models.CharField(max_length=16, choices=AccountKind.choices)
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.PROTECT, related_name="accounts")
    currency = models.CharField(max_length=3, validators=[CURRENCY])
    debits_posted = models.BigIntegerField(default=0)
    credits_posted = models.BigIntegerField(default=0)
    debits_pending = models.BigIntegerField(default=0)
    credits_pending = models.BigIntegerField(default=0)
    # wallet-ledger-spec §3.2: a frozen wallet takes no new hold (hold_failed, account_frozen);
    # its open holds are still captured or released.
    frozen = models.BooleanField(default=False)
    # wallet-ledger-spec §3.1: a system account of one (kind, currency) is split into
    # AGENTPAY_SYSTEM_ACCOUNT_SHARDS accounts, so two wallets' holds rarely update the same row.
    # A wallet's shard is 0.
    shard = models.PositiveSmallIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(debits_posted__gte=0, credits_posted__gte=0, debits_pending__gte=0,
                            credits_pending__gte=0),
                name="ledger_totals_non_negative"),
            # The rule the seed's 402 rests on: a wallet never goes below zero available.
            models.CheckConstraint(
                condition=~Q(kind="wallet") | Q(credits_posted__gte=F("debits_posted") + F("debits_pending")),
                name="wallet_available_non_negative"),
            models.CheckConstraint(condition=Q(kind="wallet", tenant__isnull=False) | (~Q(kind="wallet")
                                                                                      & Q(tenant__isnull=True)),
                                   name="wallet_has_tenant_system_has_none"),
            models.UniqueConstraint(fields=["tenant", "currency"], condition=Q(kind="wallet"),
                                    name="one_wallet_per_tenant_currency"),
            models.UniqueConstraint(fields=["kind", "currency", "shard"], condition=~Q(kind="wallet"),
                                    name="one_system_account_per_kind_currency_shard"),
            models.CheckConstraint(condition=~Q(kind="wallet") | Q(shard=0), name="wallet_shard_zero"),
        ]

    def __str__(self) -> str:
        owner = self.tenant.name if self.tenant_id else "system"
        return f"{self.kind} {self.currency} ({owner})"

    @property
    def available(self) -> int:
        return self.credits_posted - self.debits_posted - self.debits_pending


class TransferKind(models.TextChoices):
    POSTED = "posted", "Posted (single phase)"
    PENDING = "pending", "Pending (a hold)"
    POST_PENDING = "post_pending", "Posts a hold (capture)"
    VOID_PENDING = "void_pending", "Voids a hold (release)"


class Transfer(AppendOnlyModel):
    """One immutable ledger movement. A hold's resolution is a new row that names the hold; the
    unique constraint on `pending` is what makes "resolved exactly once" a database fact."""

    transfer_id = models.CharField(max_length=40, unique=True)
    kind = models.CharField(max_length=16, choices=TransferKind.choices)
    debit_account = models.ForeignKey(LedgerAccount, on_delete=models.PROTECT, related_name="debits")
    credit_account = models.ForeignKey(LedgerAccount, on_delete=models.PROTECT, related_name="credits")
    amount = models.PositiveBigIntegerField()
    currency = models.CharField(max_length=3, validators=[CURRENCY])
    # Indexed by hold_resolved_once (unique where set), not on its own.
    pending = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="+",
                                help_text="The hold this transfer posts or voids.", db_index=False)
    intent = models.ForeignKey("agentpay.PaymentIntent", null=True, blank=True, on_delete=models.PROTECT,
                               related_name="transfers")
    reason = models.TextField(blank=True, default="")
    ticket = models.CharField(max_length=128, blank=True, default="")
    external_ref = models.CharField(max_length=255, blank=True, default="",
                                    help_text="Provider payment id of a top-up (unique: one receipt, one credit).")
    actor = models.CharField(max_length=150)
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(amount__gt=0), name="transfer_amount_positive"),
            models.CheckConstraint(condition=~Q(debit_account=F("credit_account")), name="transfer_two_accounts"),
            models.CheckConstraint(
                condition=(Q(kind__in=["post_pending", "void_pending"], pending__isnull=False)
                           | (Q(kind__in=["posted", "pending"]) & Q(pending__isnull=True))),
                name="transfer_resolution_names_its_hold"),
            models.UniqueConstraint(fields=["pending"], condition=Q(pending__isnull=False),
                                    name="hold_resolved_once"),
            models.UniqueConstraint(fields=["external_ref"], condition=~Q(external_ref=""),
                                    name="topup_receipt_credited_once"),
        ]

    def __str__(self) -> str:
        return f"{self.transfer_id} {self.kind} {self.amount} {self.currency}"
