"""What the merchant holds of Alipay recurring deduction, which Alipay itself does not.

Alipay keeps agreements and trades; it keeps no plans, no billing periods and no renewal
orders: the merchant decides when to deduct and how much. These rows are that merchant side,
owned by the Alipay adapter alone:

* `AlipayAgreement`: the plan terms of one deduction agreement (the provider subscription) and
  its current billing period.
* `AlipayRenewalOrder`: one period's renewal order (the provider invoice), keyed by `order_no`.
* `AlipayTrade`: one deduction sent to Alipay (`out_trade_no`), written *before* it is sent, with
  the last answer Alipay gave about it. Alipay's query stays the truth; this is what we asked.
"""

from __future__ import annotations

from django.db import models


class AlipayAgreement(models.Model):
    external_agreement_no = models.CharField(max_length=64, unique=True,
                                             help_text="Ours, given to Alipay when the customer signs.")
    agreement_no = models.CharField(max_length=64, blank=True, default="",
                                    help_text="Alipay's, known once the customer signed.")
    app_id = models.CharField(max_length=32, help_text="The merchant app the agreement was signed with.")
    customer_email = models.EmailField(blank=True, default="")
    alipay_user_id = models.CharField(max_length=32, blank=True, default="")
    price_id = models.CharField(max_length=64)
    amount = models.BigIntegerField(help_text="Minor units (fen) deducted each period.")
    currency = models.CharField(max_length=3, default="cny")
    interval = models.CharField(max_length=8, default="month")
    period_start = models.DateTimeField()
    period_end = models.DateTimeField(help_text="When the next renewal order is due.")
    created_at = models.DateTimeField()
    merchant_canceled_at = models.DateTimeField(
        null=True, blank=True, help_text="When we unsigned the agreement (a dunning cancellation): the contract ended.")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["agreement_no"], condition=~models.Q(agreement_no=""),
                                    name="uniq_alipay_agreement_no"),
            models.CheckConstraint(condition=models.Q(amount__gt=0), name="alipay_agreement_amount_positive"),
        ]

    def __str__(self) -> str:
        return self.agreement_no or self.external_agreement_no


class AlipayRenewalOrder(models.Model):
    order_no = models.CharField(max_length=32, unique=True)
    agreement = models.ForeignKey(AlipayAgreement, on_delete=models.PROTECT, related_name="orders")
    amount = models.BigIntegerField()
    currency = models.CharField(max_length=3)
    period_start = models.DateTimeField()
    period_end = models.DateTimeField()
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            # One renewal order per agreement and period, whoever opens it first.
            models.UniqueConstraint(fields=["agreement", "period_start"], name="uniq_alipay_order_period"),
        ]

    def __str__(self) -> str:
        return self.order_no


class TradeStatus(models.TextChoices):
    SENT = "SENT", "Sent, no answer yet"  # written before the call; a crash or timeout leaves it here
    WAIT_BUYER_PAY = "WAIT_BUYER_PAY"
    TRADE_SUCCESS = "TRADE_SUCCESS"
    TRADE_FINISHED = "TRADE_FINISHED"
    TRADE_CLOSED = "TRADE_CLOSED"
    FAILED = "FAILED", "Refused by Alipay (no trade)"
    NOT_FOUND = "NOT_FOUND", "Alipay has no such trade"


PAID_TRADE_STATUSES = frozenset({TradeStatus.TRADE_SUCCESS, TradeStatus.TRADE_FINISHED})
FAILED_TRADE_STATUSES = frozenset({TradeStatus.TRADE_CLOSED, TradeStatus.FAILED})


class AlipayTrade(models.Model):
    out_trade_no = models.CharField(max_length=64, unique=True)
    order = models.ForeignKey(AlipayRenewalOrder, on_delete=models.PROTECT, related_name="trades")
    idempotency_key = models.CharField(max_length=255, help_text="The attempt this deduction belongs to.")
    amount = models.BigIntegerField()
    sent_at = models.DateTimeField()
    status = models.CharField(max_length=16, choices=TradeStatus.choices, default=TradeStatus.SENT)
    trade_no = models.CharField(max_length=64, blank=True, default="")
    sub_code = models.CharField(max_length=64, blank=True, default="",
                                help_text="Alipay's sub_code of a refused deduction (ACQ.BALANCE_NOT_ENOUGH, ...).")
    answered_at = models.DateTimeField(null=True, blank=True)
    paid_at = models.DateTimeField(null=True, blank=True,
                                   help_text="When Alipay says it was paid (gmt_payment, send_pay_date).")

    class Meta:
        verbose_name = "Alipay deduction"
        constraints = [models.UniqueConstraint(fields=["idempotency_key"], name="uniq_alipay_trade_key")]

    def __str__(self) -> str:
        return self.out_trade_no
