"""What the customer can do about one open invoice, in plain words (SPEC §12).

A button is offered only where it can work: the checks are the payment services' own
(`pay_now_blocker`, `retry_now_blocker`), so what the page offers and what a press does never
disagree. Where no button can work the customer is told why and what to do instead.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from dunning.actions.retry_now import (
    REFUSAL_TEXT,
    customer_payment_unresolved,
    pay_now_blocker,
    retry_now_blocker,
)
from dunning.models import DunningCycle
from dunning.policy.cache import policy_spec
from subscriptions.billing.wording import PaymentWords

UNANSWERED = ("We sent your payment but have not had an answer from your bank yet. We will not charge you twice: "
              "check again in a few minutes, or press the button to ask now.")
PAY_NOW_NOTE = ("Pay with your card on file: your access is restored as soon as the payment goes through. "
                "You are charged once, never twice, even if this page is interrupted.")
DECLINED_FOR_GOOD = "Your bank declined the payment and asked us not to try this card again. Nothing was charged. "
ADD_CARD_THEN_PAY = "Add a new card on the secure payment page, then come back here and press \u201cPay now\u201d."
ADD_CARD_LOCAL = "Add a new card on the secure payment page; we will then try it for you, or you can pay there."


@dataclass(frozen=True)
class InvoiceAction:
    button: str = ""  # the one button's label ("" for none)
    url_name: str = ""  # billing-pay-now | billing-retry-now
    notice: str = ""  # plain words: what is happening, or what to do instead
    card_declined: bool = False  # a new card is needed first: the payment page is the way
    tone: str = "info"  # info (plain text) | wait (an answer is awaited) | alert (the customer must act)


def invoice_action(cycle: DunningCycle | None, *, amount: str, now: datetime,
                   words: PaymentWords | None = None) -> InvoiceAction:
    """`words`: the provider's wording (subscriptions.billing.wording.payment_words); where it has its
    own text for a card-worded notice (Alipay: sign the deduction agreement again), that text is used."""
    if cycle is None:
        return InvoiceAction()
    if policy_spec(cycle.policy).retry_authority == "PAYMENT_PROVIDER":
        action = _provider_action(cycle, amount, now)
    else:
        action = _local_action(cycle)
    return _in_provider_words(action, words)


def _in_provider_words(action: InvoiceAction, words: PaymentWords | None) -> InvoiceAction:
    if words is None:
        return action
    if action.card_declined and words.method_gone:
        return replace(action, notice=words.method_gone)
    if action.tone == "alert" and not action.card_declined and words.budget_used:
        return replace(action, notice=words.budget_used)
    return action


def _provider_action(cycle: DunningCycle, amount: str, now: datetime) -> InvoiceAction:
    if customer_payment_unresolved(cycle, now) is not None:
        return InvoiceAction("Check on my payment", "billing-pay-now", UNANSWERED, tone="wait")
    blocker = pay_now_blocker(cycle)
    if blocker is None:
        return InvoiceAction(f"Pay {amount} now", "billing-pay-now", PAY_NOW_NOTE)
    if blocker == "NON_RETRYABLE_NO_RETRY":
        return InvoiceAction(notice=DECLINED_FOR_GOOD + ADD_CARD_THEN_PAY, card_declined=True, tone="alert")
    if blocker == "ATTEMPT_IN_PROGRESS":
        return InvoiceAction(notice=REFUSAL_TEXT[blocker], tone="wait")
    return InvoiceAction()


def _local_action(cycle: DunningCycle) -> InvoiceAction:
    blocker = retry_now_blocker(cycle)
    if blocker is None:
        return InvoiceAction("Retry payment now", "billing-retry-now")
    if blocker == "NON_RETRYABLE_NO_RETRY":
        return InvoiceAction(notice=DECLINED_FOR_GOOD + ADD_CARD_LOCAL, card_declined=True, tone="alert")
    if blocker == "ATTEMPT_IN_PROGRESS":
        return InvoiceAction(notice=REFUSAL_TEXT[blocker], tone="wait")
    if blocker == "ATTEMPT_BUDGET_EXHAUSTED":
        return InvoiceAction(notice=REFUSAL_TEXT[blocker], tone="alert")
    return InvoiceAction()
