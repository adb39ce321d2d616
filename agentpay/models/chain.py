"""The on-chain rail's records (seed 004 §3.1, §4.2; issue 18): what we asked for, what the payer
signed, and every transaction we signed — kept before it is broadcast, so an outcome we did not
see is resolved by querying for *that* transaction, never by signing another.

Money on chain is in the token's atomic units (uint256): `DecimalField(max_digits=78)` holds any
of them exactly. Addresses are stored lowercase (`0x` + 40 hex), hashes and nonces as `0x` + 64
hex, so uniqueness never depends on checksum casing.
"""

from __future__ import annotations

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q

from agentpay import ids
from agentpay.models.append_only import AppendOnlyModel

ADDRESS = RegexValidator(r"^0x[0-9a-f]{40}$", "a lowercase 0x-prefixed 20-byte address")
BYTES32 = RegexValidator(r"^0x[0-9a-f]{64}$", "a lowercase 0x-prefixed 32-byte value")
CAIP2 = RegexValidator(r"^eip155:[0-9]{1,18}$", "a CAIP-2 EVM network id, e.g. eip155:31337")


def _uint256(**kwargs) -> models.DecimalField:
    return models.DecimalField(max_digits=78, decimal_places=0, **kwargs)


class ChainNetwork(models.Model):
    """One EVM network and the EIP-3009 token the rail takes on it (x402 scheme `exact`).

    The signing keys are not here: settings map an address to its key (`AGENTPAY_CHAIN_KEYS`).
    """

    caip2 = models.CharField(max_length=32, unique=True, validators=[CAIP2], help_text="e.g. eip155:31337")
    name = models.CharField(max_length=100)
    chain_id = models.PositiveBigIntegerField()
    rpc_url = models.URLField(max_length=500)
    rpc_timeout_seconds = models.FloatField(default=5.0)
    # seed §4.2: "达到 1 个区块确认" — the default depth; a network may ask for more.
    confirmations = models.PositiveSmallIntegerField(default=1)
    token_address = models.CharField(max_length=42, validators=[ADDRESS])
    token_name = models.CharField(max_length=100, help_text="the token's EIP-712 domain name")
    token_version = models.CharField(max_length=20, help_text="the token's EIP-712 domain version")
    token_decimals = models.PositiveSmallIntegerField(default=6)
    # A route's price is in its currency's minor units (cents); one minor unit is this many
    # atomic token units (a 6-decimal USD token: 10,000).
    currency = models.CharField(max_length=3, default="usd")
    atomic_per_minor = models.PositiveBigIntegerField(default=10_000)
    pay_to = models.CharField(max_length=42, validators=[ADDRESS],
                              help_text="where payments go; refunds come from here")
    submitter = models.CharField(max_length=42, validators=[ADDRESS],
                                 help_text="the account that submits transferWithAuthorization and pays gas")
    active = models.BooleanField(default=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.caip2})"


class PaymentChallenge(AppendOnlyModel):
    """The 402 we sent for an intent: exactly the `accepts[]` entry the payer must meet."""

    challenge_id = models.CharField(max_length=40, unique=True, default=ids.new_challenge_id)
    intent = models.OneToOneField("agentpay.PaymentIntent", on_delete=models.PROTECT, related_name="challenge")
    network = models.ForeignKey(ChainNetwork, on_delete=models.PROTECT, related_name="+")
    pay_to = models.CharField(max_length=42, validators=[ADDRESS])
    asset = models.CharField(max_length=42, validators=[ADDRESS])
    amount = _uint256()
    issued_at = models.DateTimeField()
    expires_at = models.DateTimeField(help_text="issued_at + 300 s (seed §4.1 challenged → expired)")
    requirement = models.JSONField(help_text="the PAYMENT-REQUIRED document as sent")

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(amount__gt=0), name="challenge_amount_positive")]


class ChainAuthorization(AppendOnlyModel):
    """The EIP-3009 `transferWithAuthorization` a payer signed for one intent (PAYMENT-SIGNATURE)."""

    intent = models.OneToOneField("agentpay.PaymentIntent", on_delete=models.PROTECT, related_name="authorization")
    network = models.ForeignKey(ChainNetwork, on_delete=models.PROTECT, related_name="+")
    token_address = models.CharField(max_length=42, validators=[ADDRESS])
    payer = models.CharField(max_length=42, validators=[ADDRESS])
    pay_to = models.CharField(max_length=42, validators=[ADDRESS])
    value = _uint256()
    valid_after = _uint256()
    valid_before = _uint256()
    nonce = models.CharField(max_length=66, validators=[BYTES32])
    signature = models.CharField(max_length=200)
    payload = models.JSONField(help_text="the decoded PAYMENT-SIGNATURE document")
    received_at = models.DateTimeField()

    class Meta:
        constraints = [
            # issue 18: one signed authorization can pay one intent, never two.
            models.UniqueConstraint(fields=["network", "token_address", "payer", "nonce"],
                                    name="one_intent_per_signed_authorization"),
        ]

    def __str__(self) -> str:
        return f"{self.payer} nonce {self.nonce[:10]}… ({self.value})"


class ChainTxPurpose(models.TextChoices):
    SETTLEMENT = "settlement", "Settlement (transferWithAuthorization)"
    REFUND = "refund", "Refund (transfer back to the payer)"


class ChainTransaction(AppendOnlyModel):
    """One transaction we signed. Written, with its raw bytes and precomputed hash, before the
    broadcast: after a crash or a timeout the only thing ever sent again is these same bytes.
    Only the broadcast and query bookkeeping may change; the signed bytes never do."""

    MUTABLE_FIELDS = frozenset({
        "broadcast_attempts", "last_broadcast_at", "last_broadcast_answer", "block_number", "block_hash",
        "receipt_status", "queries", "last_query_at", "last_query_answer", "next_query_at"})

    tx_id = models.CharField(max_length=40, unique=True, default=ids.new_chain_tx_id)
    purpose = models.CharField(max_length=12, choices=ChainTxPurpose.choices)
    network = models.ForeignKey(ChainNetwork, on_delete=models.PROTECT, related_name="+")
    settlement = models.OneToOneField("agentpay.Settlement", null=True, blank=True, on_delete=models.PROTECT,
                                      related_name="chain_tx")
    refund = models.OneToOneField("agentpay.RefundObligation", null=True, blank=True, on_delete=models.PROTECT,
                                  related_name="chain_tx")
    sender = models.CharField(max_length=42, validators=[ADDRESS])
    sender_nonce = models.PositiveBigIntegerField()
    raw_tx = models.TextField(help_text="the signed transaction, 0x-hex")
    tx_hash = models.CharField(max_length=66, unique=True, validators=[BYTES32])
    signed_at = models.DateTimeField()
    broadcast_attempts = models.PositiveIntegerField(default=0)
    last_broadcast_at = models.DateTimeField(null=True, blank=True)
    last_broadcast_answer = models.TextField(blank=True, default="")
    # What the last query saw (evidence for the admin and the auditor; the state is on the line).
    block_number = models.PositiveBigIntegerField(null=True, blank=True)
    block_hash = models.CharField(max_length=66, blank=True, default="")
    receipt_status = models.PositiveSmallIntegerField(null=True, blank=True)
    queries = models.PositiveIntegerField(default=0)
    last_query_at = models.DateTimeField(null=True, blank=True)
    last_query_answer = models.TextField(blank=True, default="")
    next_query_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # An account nonce is spent once: two different transactions for one never exist.
            models.UniqueConstraint(fields=["network", "sender", "sender_nonce"], name="one_tx_per_sender_nonce"),
            models.CheckConstraint(
                condition=(Q(purpose="settlement", settlement__isnull=False, refund__isnull=True)
                           | Q(purpose="refund", refund__isnull=False, settlement__isnull=True)),
                name="chain_tx_has_one_owner"),
        ]
        indexes = [models.Index(fields=["next_query_at"], name="chain_tx_due",
                                condition=Q(next_query_at__isnull=False))]

    def __str__(self) -> str:
        return f"{self.tx_id} {self.tx_hash[:12]}…"


class RefundObligation(models.Model):
    """Paid on chain, not delivered (fulfillment 4xx, seed §3.1 `refund_required`): we owe the
    payer their money back. A billing lead owns it and pays it on chain through the same
    settlement machinery; its state line is the on-chain settlement's (not_started → submitted →
    pending → confirmed, with unknown and failed)."""

    refund_id = models.CharField(max_length=40, unique=True, default=ids.new_refund_id)
    intent = models.OneToOneField("agentpay.PaymentIntent", on_delete=models.PROTECT, related_name="refund")
    network = models.ForeignKey(ChainNetwork, on_delete=models.PROTECT, related_name="+")
    payer = models.CharField(max_length=42, validators=[ADDRESS])
    amount = _uint256()
    state = models.CharField(max_length=16, default="not_started")
    generation = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField()
    state_changed_at = models.DateTimeField()
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT,
                              related_name="agentpay_refunds")
    owner_assigned_at = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(blank=True, default="")
    ticket = models.CharField(max_length=100, blank=True, default="")

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(amount__gt=0), name="refund_amount_positive")]
        indexes = [models.Index(fields=["state", "created_at"], name="refund_open",
                                condition=~Q(state__in=["confirmed"]))]

    def __str__(self) -> str:
        return f"{self.refund_id} {self.state} ({self.amount})"


class AuditAction(models.TextChoices):
    NONE = "none", "Recorded (a person reads it)"
    REBROADCAST = "rebroadcast", "The same signed bytes sent again"
    CLEARED = "cleared", "The chain shows it confirmed again"


class SettlementAuditFinding(AppendOnlyModel):
    """A confirmed transaction of ours (a settlement or a refund) that the chain no longer shows
    where it was: a reorganisation deeper than the confirmation depth. The line stays confirmed
    (terminal states never change); this row is the evidence and what the audit did about it.
    `needs_review`: money we counted may not have moved, so a billing lead must look."""

    transaction = models.ForeignKey(ChainTransaction, on_delete=models.PROTECT, related_name="audit_findings")
    found_at = models.DateTimeField()
    evidence_kind = models.CharField(max_length=12, help_text="what the chain showed (Evidence.kind)")
    detail = models.TextField()
    block_number = models.PositiveBigIntegerField(null=True, blank=True)
    block_hash = models.CharField(max_length=66, blank=True, default="")
    action = models.CharField(max_length=12, choices=AuditAction.choices)
    broadcast_answer = models.TextField(blank=True, default="")
    needs_review = models.BooleanField()

    class Meta:
        ordering = ["-found_at", "-id"]
        indexes = [models.Index(fields=["transaction", "-found_at"], name="audit_finding_latest")]

    def __str__(self) -> str:
        return f"{self.transaction.tx_id} {self.evidence_kind} → {self.action}"
