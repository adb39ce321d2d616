"""Alipay recurring deduction behind the provider interface (seed 003, SPEC §17).

The product's words, Alipay's things:

* a subscription is a deduction agreement (`agreement_no`): Alipay's agreement status plus the
  plan terms and period we hold (`AlipayAgreement`);
* an invoice is a renewal order (`order_no`), ours, made of the deductions we sent for it
  (`AlipayTrade`, one `out_trade_no` each). Its status is what `alipay.trade.query` says of
  those deductions now: paid when one succeeded, else open, with each closed or refused
  deduction counted as an attempt;
* paying an invoice sends one deduction under an attempt's key. The key names one
  `out_trade_no`, written before it is sent. Sent again (after a timeout), it is first queried:
  a charge that happened is found, not repeated; Alipay also refuses a second charge of the same
  `out_trade_no`. A new attempt has a new key, so a new `out_trade_no`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from dunning.clock import trusted_now
from subscriptions.providers.alipay import events
from subscriptions.providers.alipay.gateway import AlipayGateway, GatewayAnswer
from subscriptions.providers.alipay.records import (
    FAILED_TRADE_STATUSES,
    PAID_TRADE_STATUSES,
    AlipayAgreement,
    AlipayRenewalOrder,
    AlipayTrade,
    TradeStatus,
)
from subscriptions.providers.base import (
    EventSubject,
    NotificationAnswer,
    PayOutcome,
    ProviderCustomer,
    ProviderDeclined,
    ProviderDispute,
    ProviderIndeterminate,
    ProviderInvoice,
    ProviderNotFound,
    ProviderPayment,
    ProviderPrice,
    ProviderSubscription,
    WebhookVerificationError,
)

SUCCESS, IN_PROGRESS, SYSTEM_ERROR, BUSINESS_FAILED = "10000", "10003", "20000", "40004"
# Refusals that mean "this out_trade_no was already decided": the query says how.
ALREADY_DECIDED = frozenset({"ACQ.TRADE_HAS_SUCCESS", "ACQ.TRADE_HAS_CLOSE", "ACQ.TRADE_HAS_FINISHED"})
TRANSIENT_SUB_CODES = frozenset({"ACQ.SYSTEM_ERROR", "ACQ.TRADE_STATUS_ERROR", "aop.ACQ.SYSTEM_ERROR"})
CLOSED_WITHOUT_REASON = "ACQ.TRADE_HAS_CLOSE"
FINAL_STATUSES = PAID_TRADE_STATUSES | FAILED_TRADE_STATUSES


def out_trade_no_for(order_no: str, idempotency_key: str) -> str:
    """One attempt's key always names the same deduction; Alipay takes letters, digits and `_`."""
    return f"{order_no}T{hashlib.sha256(idempotency_key.encode()).hexdigest()[:12]}"


class AlipayProvider:
    name = "alipay"
    label = "Alipay"
    webhook_headers = frozenset({"content-type", "content-length", "user-agent", "x-forwarded-for"})
    # An out_trade_no is Alipay's own idempotency record; resending it is safe for as long as the
    # product resends at all. A day, as for Stripe, keeps the unknown-too-long alert the same.
    idempotency_retention = timedelta(hours=24)
    lists_events = False  # Alipay lists no past notifications: its daily bill is checked instead
    paid_event_types = events.PAID_EVENT_TYPES

    def __init__(self, *, gateway: AlipayGateway | None, app_id: str, plans: Mapping[str, Mapping[str, Any]]) -> None:
        self.account = app_id
        self.plans = plans
        self._gateway = gateway

    @property
    def gateway(self) -> AlipayGateway:
        if self._gateway is None:
            raise ProviderIndeterminate("Alipay is not configured (ALIPAY_APP_ID and the keys are unset)")
        return self._gateway

    # ---- the agreement (subscription)
    def fetch_subscription(self, subscription_id: str) -> ProviderSubscription:
        answer = self.gateway.agreement_query(subscription_id)
        if answer.code == BUSINESS_FAILED:
            raise ProviderNotFound(f"Alipay has no agreement {subscription_id}: {answer.sub_code}")
        _require_success(answer)
        remote = answer.body
        terms = self._terms_for(subscription_id, remote)
        unsigned = remote.get("status") != "NORMAL"
        ended = terms.merchant_canceled_at is not None
        # A customer who revokes the agreement stops future deductions: the contract runs to the
        # end of the paid period (seed 003's FAQ: revoked authorisation ends auto-renewal). We
        # unsigning it for a dunning cancellation ends it now.
        return ProviderSubscription(
            id=subscription_id, account=self.account, customer_id=terms.alipay_user_id or str(
                remote.get("alipay_user_id", "")), customer_email=terms.customer_email,
            status="canceled" if ended else "active", price_ids=(terms.price_id,), interval=terms.interval,
            cancel_at_period_end=unsigned and not ended, current_period_start=terms.period_start,
            current_period_end=terms.period_end, canceled_at=terms.merchant_canceled_at,
            ended_at=terms.merchant_canceled_at, provider=self.name,
            raw={"id": subscription_id, "object": "alipay_agreement", "status": remote.get("status", ""),
                 "external_agreement_no": terms.external_agreement_no, "price_id": terms.price_id,
                 "amount": terms.amount, "currency": terms.currency, "interval": terms.interval,
                 "period_start": terms.period_start.isoformat(), "period_end": terms.period_end.isoformat(),
                 "agreement": remote},
        )

    def _terms_for(self, agreement_no: str, remote: dict[str, Any]) -> AlipayAgreement:
        terms = AlipayAgreement.objects.filter(agreement_no=agreement_no).first()
        if terms is not None:
            return terms
        external = str(remote.get("external_agreement_no") or "")
        terms = AlipayAgreement.objects.filter(external_agreement_no=external, agreement_no="").first() \
            if external else None
        if terms is None:
            raise ProviderNotFound(f"agreement {agreement_no} was not signed with this merchant")
        # The customer signed: Alipay's agreement number joins our terms, once.
        AlipayAgreement.objects.filter(pk=terms.pk, agreement_no="").update(
            agreement_no=agreement_no, alipay_user_id=str(remote.get("alipay_user_id", ""))[:32])
        terms.refresh_from_db()
        return terms

    def cancel_subscription(self, subscription_id: str, *, idempotency_key: str) -> ProviderSubscription:
        if not idempotency_key:
            raise ValueError("cancelling an agreement needs an idempotency key")
        terms = AlipayAgreement.objects.filter(agreement_no=subscription_id).first()
        if terms is None:
            raise ProviderNotFound(f"no agreement {subscription_id} with this merchant")
        answer = self.gateway.agreement_unsign(subscription_id)
        if answer.code not in (SUCCESS, BUSINESS_FAILED):  # a 40004 is an agreement already unsigned
            raise ProviderIndeterminate(f"agreement unsign answered {answer.code} {answer.sub_code}")
        from_now = _now()
        AlipayAgreement.objects.filter(pk=terms.pk, merchant_canceled_at__isnull=True).update(
            merchant_canceled_at=from_now)
        return self.fetch_subscription(subscription_id)

    def fetch_customer(self, customer_id: str) -> ProviderCustomer:
        terms = AlipayAgreement.objects.filter(alipay_user_id=customer_id).exclude(agreement_no="") \
            .order_by("-created_at").first()
        if terms is None:
            raise ProviderNotFound(f"no Alipay user {customer_id} signed with this merchant")
        answer = self.gateway.agreement_query(terms.agreement_no)
        signed = answer.code == SUCCESS and answer.body.get("status") == "NORMAL"
        return ProviderCustomer(id=customer_id, account=self.account, email=terms.customer_email,
                                default_payment_method=terms.agreement_no if signed else None,
                                raw={"id": customer_id, "object": "alipay_user", "agreement_no": terms.agreement_no,
                                     "agreement_status": answer.body.get("status", "")})

    def payment_method_of(self, payment: ProviderPayment) -> str | None:
        return payment.raw.get("agreement_no") or None

    def fetch_price(self, price_id: str) -> ProviderPrice:
        plan = self.plans.get(price_id)
        if plan is None:
            raise ProviderNotFound(f"no Alipay plan {price_id}")
        return ProviderPrice(id=price_id, product_name=str(plan.get("name", "")),
                             interval=str(plan.get("interval", "")), raw={"id": price_id, **plan})

    # ---- the renewal order (invoice) and its deductions
    def fetch_invoice(self, invoice_id: str) -> ProviderInvoice:
        order = AlipayRenewalOrder.objects.select_related("agreement").filter(order_no=invoice_id).first()
        if order is None:
            raise ProviderNotFound(f"no renewal order {invoice_id}")
        trades = list(order.trades.order_by("sent_at", "pk"))
        for trade in trades:
            if trade.status not in FINAL_STATUSES:
                self._ask_about(trade)
        return _as_invoice(order, trades, account=self.account)

    def invoice_for_payment(self, payment_id: str) -> str | None:
        trade = AlipayTrade.objects.select_related("order").filter(out_trade_no=payment_id).first()
        return trade.order.order_no if trade else None

    def fetch_payment(self, payment_id: str) -> ProviderPayment:
        trade = AlipayTrade.objects.select_related("order__agreement").filter(out_trade_no=payment_id).first()
        if trade is None:
            raise ProviderNotFound(f"no deduction {payment_id} was sent by us")
        if trade.status not in FINAL_STATUSES:
            self._ask_about(trade)
        status = ("succeeded" if trade.status in PAID_TRADE_STATUSES else "failed"
                  if trade.status in FAILED_TRADE_STATUSES else "processing")
        return ProviderPayment(id=trade.out_trade_no, object="alipay_trade", status=status, amount=trade.amount,
                               amount_refunded=0, currency=trade.order.currency, invoice_id=trade.order.order_no,
                               decline_code=_decline_code(trade) if status == "failed" else "", disputed=False,
                               raw=_trade_body(trade) | {"agreement_no": trade.order.agreement.agreement_no})

    def fetch_dispute(self, dispute_id: str) -> ProviderDispute:
        raise ProviderNotFound("Alipay deductions have no disputes in this product")

    def pay_invoice(self, invoice_id: str, *, idempotency_key: str) -> PayOutcome:
        if not idempotency_key:
            raise ValueError("paying a renewal order needs an idempotency key")
        order = AlipayRenewalOrder.objects.select_related("agreement").filter(order_no=invoice_id).first()
        if order is None:
            raise ProviderNotFound(f"no renewal order {invoice_id}")
        trade, created = AlipayTrade.objects.get_or_create(
            idempotency_key=idempotency_key,
            defaults={"out_trade_no": out_trade_no_for(order.order_no, idempotency_key), "order": order,
                      "amount": order.amount, "sent_at": _now()})
        if not created:
            # Sent before, and its answer not known: ask first (seed 003: a timeout is never a failure).
            if trade.status not in FINAL_STATUSES:
                self._ask_about(trade)
            if trade.status in FINAL_STATUSES:
                return self._outcome(order, trade)
            if trade.status == TradeStatus.WAIT_BUYER_PAY:
                raise ProviderIndeterminate(f"deduction {trade.out_trade_no} is still being processed")
            # NOT_FOUND: Alipay has no trade for it, so nothing was charged: the same out_trade_no
            # is sent again (Alipay would refuse to charge it twice anyway).
        answer = self.gateway.trade_pay(trade.out_trade_no, order.agreement.agreement_no, trade.amount,
                                        subject=f"Renewal {order.period_start:%Y-%m-%d}")
        self._record_pay_answer(trade, answer)
        return self._outcome(order, trade)

    def _outcome(self, order: AlipayRenewalOrder, trade: AlipayTrade) -> PayOutcome:
        if trade.status in PAID_TRADE_STATUSES:
            trades = list(order.trades.order_by("sent_at", "pk"))
            return PayOutcome(invoice=_as_invoice(order, trades, account=self.account), payment_ref=trade.out_trade_no)
        if trade.status in FAILED_TRADE_STATUSES:
            raise ProviderDeclined(f"Alipay refused deduction {trade.out_trade_no}: {_decline_code(trade)}",
                                   decline_code=_decline_code(trade), payment_ref=trade.out_trade_no,
                                   raw=_trade_body(trade))
        raise ProviderIndeterminate(f"deduction {trade.out_trade_no} has no outcome yet ({trade.status})")

    def _record_pay_answer(self, trade: AlipayTrade, answer: GatewayAnswer) -> None:
        body = answer.body
        if answer.code == SUCCESS and body.get("trade_status", "TRADE_SUCCESS") in PAID_TRADE_STATUSES:
            _save(trade, TradeStatus.TRADE_SUCCESS, trade_no=str(body.get("trade_no", "")),
                  paid_at=events.notify_time(str(body.get("gmt_payment", ""))))
        elif answer.code == BUSINESS_FAILED and answer.sub_code in ALREADY_DECIDED:
            self._ask_about(trade)  # decided by an earlier send: the query says how
        elif answer.code == BUSINESS_FAILED and answer.sub_code not in TRANSIENT_SUB_CODES:
            _save(trade, TradeStatus.FAILED, sub_code=answer.sub_code[:64])
        else:
            # 10003 (waiting), 20000 (system error), a transient 40004: the charge may still happen.
            raise ProviderIndeterminate(f"alipay.trade.pay {trade.out_trade_no} answered {answer.code} "
                                        f"{answer.sub_code}".strip())

    def _ask_about(self, trade: AlipayTrade) -> None:
        """alipay.trade.query: the truth about one deduction. Raises ProviderIndeterminate when
        Alipay cannot say."""
        answer = self.gateway.trade_query(trade.out_trade_no)
        if answer.code == SUCCESS:
            status = str(answer.body.get("trade_status", ""))
            if status not in TradeStatus.values:
                raise ProviderIndeterminate(f"trade {trade.out_trade_no} has status {status[:32]!r}")
            _save(trade, TradeStatus(status), trade_no=str(answer.body.get("trade_no", "")),
                  paid_at=events.notify_time(str(answer.body.get("send_pay_date", ""))))
        elif answer.code == BUSINESS_FAILED and answer.sub_code == "ACQ.TRADE_NOT_EXIST":
            _save(trade, TradeStatus.NOT_FOUND)
        else:
            raise ProviderIndeterminate(f"alipay.trade.query {trade.out_trade_no} answered {answer.code} "
                                        f"{answer.sub_code}".strip())

    # ---- events: none to list (the daily bill is Alipay's record)
    def list_events(self, *, created_after: datetime | None = None, limit: int = 100) -> list[dict[str, Any]]:
        return []

    def list_events_since(self, *, created_after: datetime, max_events: int = 10_000) -> list[dict[str, Any]]:
        return []

    # ---- notifications
    def verify_notification(self, *, payload: bytes, headers: Mapping[str, str], now: datetime) -> dict[str, Any]:
        form = events.parse_form(payload)
        events.check_signature_fields(form)
        if self._gateway is None:
            raise WebhookVerificationError("Alipay is not configured here", code="NO_SECRET_CONFIGURED")
        if not self._gateway.verify_notification(form):
            raise WebhookVerificationError("the RSA2 signature does not verify with Alipay's public key",
                                           code="SIGNATURE_MISMATCH")
        return events.envelope(form)

    def notification_problem(self, event: dict[str, Any]) -> tuple[str, str] | None:
        return events.notification_problem(event, app_id=self.account)

    def event_subject(self, event_type: str, payload: dict[str, Any]) -> EventSubject:
        return events.event_subject(event_type, payload)

    def answer_notification(self, *, status: int, code: str, detail: str, body: dict[str, Any]) -> NotificationAnswer:
        # Alipay reads exactly `success`; any other body is a failure it delivers again later.
        if status == 200:
            return NotificationAnswer(200, "text/plain; charset=utf-8", b"success")
        return NotificationAnswer(status, "text/plain; charset=utf-8", b"fail")


def _require_success(answer: GatewayAnswer) -> None:
    if answer.code != SUCCESS:
        raise ProviderIndeterminate(f"{answer.method} answered {answer.code} {answer.sub_code}".strip())


def _save(trade: AlipayTrade, status: str, *, trade_no: str = "", sub_code: str = "",
          paid_at: datetime | None = None) -> None:
    trade.status = status
    trade.trade_no = trade_no or trade.trade_no
    trade.sub_code = sub_code or trade.sub_code
    trade.answered_at = _now()
    if status in PAID_TRADE_STATUSES:
        trade.paid_at = trade.paid_at or paid_at or trade.answered_at
    trade.save(update_fields=["status", "trade_no", "sub_code", "answered_at", "paid_at"])


def _now() -> datetime:
    return trusted_now()


def _decline_code(trade: AlipayTrade) -> str:
    return trade.sub_code or CLOSED_WITHOUT_REASON


def _trade_body(trade: AlipayTrade) -> dict[str, Any]:
    return {"id": trade.out_trade_no, "object": "alipay_trade", "status": trade.status, "trade_no": trade.trade_no,
            "sub_code": trade.sub_code, "amount": trade.amount, "sent_at": trade.sent_at.isoformat()}


def _as_invoice(order: AlipayRenewalOrder, trades: list[AlipayTrade], *, account: str) -> ProviderInvoice:
    paid = [t for t in trades if t.status in PAID_TRADE_STATUSES]
    failed = [t for t in trades if t.status in FAILED_TRADE_STATUSES]
    status = "paid" if paid else "open"
    refs = tuple(t.out_trade_no for t in failed + paid)  # the paid one last
    agreement = order.agreement
    raw = {"id": order.order_no, "object": "alipay_renewal_order", "status": status, "amount_due": order.amount,
           "amount_paid": sum(t.amount for t in paid[:1]), "currency": order.currency,
           "agreement_no": agreement.agreement_no, "period_start": order.period_start.isoformat(),
           "period_end": order.period_end.isoformat(), "trades": [_trade_body(t) for t in trades],
           "successful_trades": len(paid)}
    return ProviderInvoice(
        id=order.order_no, account=account, subscription_id=agreement.agreement_no or None,
        customer_id=agreement.alipay_user_id or None, status=status, amount_due=order.amount,
        amount_paid=raw["amount_paid"], currency=order.currency, attempt_count=len(failed) + len(paid),
        next_payment_attempt=None, payment_refs=refs, price_ids=(agreement.price_id,), billing_reason="renewal",
        period_start=order.period_start, period_end=order.period_end,
        last_decline_code=_decline_code(failed[-1]) if failed else "", raw=raw,
    )
