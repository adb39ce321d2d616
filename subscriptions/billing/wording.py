"""Plain words for the customer billing page (SPEC §12). No internal codes leave this module."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from dunning.acceptance.aggregate import is_blocking
from dunning.acceptance.settlement import cycle_view
from dunning.models import DunningCycle
from dunning.policy.cache import policy_spec
from dunning.states import GRACE_PROFILE_STATES, RESTRICTED_PROFILE_STATES, CycleState
from entitlements.profiles import FULL, PROFILES, get_profile, most_restrictive
from subscriptions.models import Subscription
from subscriptions.providers.labels import id_tail, provider_label, provider_terms

S = CycleState
SYMBOLS = {"usd": "$", "eur": "€", "gbp": "£", "cny": "¥"}


def money(amount: int, currency: str) -> str:
    symbol = SYMBOLS.get(currency.lower())
    value = f"{amount / 100:,.2f}"
    return f"{symbol}{value}" if symbol else f"{value} {currency.upper()}"


def day(when: datetime, now: datetime) -> str:
    text = f"{when.day} {when:%B}"
    return text if when.year == now.year else f"{text} {when.year}"


def moment(when: datetime, now: datetime) -> str:
    return f"{day(when, now)} at {when:%H:%M} UTC"


def summary(profile: str) -> str:
    return PROFILES[profile].summary if profile in PROFILES else "limited access"


def then_summary(profile: str) -> str:
    """A summary that follows "after that": its explanation in brackets, so the sentence goes on
    ("suspended (you can still sign in to read and export your data), unless …")."""
    head, sep, tail = summary(profile).partition(": ")
    return f"{head} ({tail})" if sep else head


def limits(profile: str) -> list[str]:
    p = get_profile(profile) if profile in PROFILES else None
    if p is None or profile == FULL:
        return []
    out = []
    if not p.read:
        out.append("You cannot open your data in the app; our support team can still export it for you.")
    if not p.write:
        out.append("You cannot create or change anything.")
    if p.api_tokens == "read_only":
        out.append("API tokens can read but not write.")
    elif p.api_tokens == "none":
        out.append("API tokens are switched off.")
    if p.background_jobs == "existing_only":
        out.append("Jobs already running finish, but no new ones start.")
    elif p.background_jobs == "none":
        out.append("Background jobs are paused.")
    if not p.excess_resources:
        out.append("No extra resources beyond your plan.")
    if p.export:
        out.append("Export always works.")
    return out


def _after_profile(cycle: DunningCycle) -> str:
    spec = policy_spec(cycle.policy)
    back = cycle.suspended_state or S.GRACE_ACTIVE
    return spec.restricted_profile if back in RESTRICTED_PROFILE_STATES else spec.grace_profile


@dataclass(frozen=True)
class AccessText:
    headline: str
    profile: str


def contract_text(sub: Subscription, now: datetime) -> str:
    """The contract in plain words ('' when it is simply running)."""
    if sub.contract_phase in ("canceled", "incomplete_expired"):
        ended = f" on {day(sub.contract_ended_at, now)}" if sub.contract_ended_at else ""
        if sub.provider_cancel_requested_at and sub.provider_cancel_confirmed_at is None:
            return "Your subscription was canceled for the unpaid invoice; no new invoices will be issued."
        return f"Your subscription ended{ended}. Our support team can still export your data for you."
    if sub.provider_cancel_requested_at and sub.provider_cancel_confirmed_at is None:
        return "Your subscription was canceled for the unpaid invoice; no new invoices will be issued."
    if sub.contract_phase == "paused":
        until = f" until {day(sub.pause_resumes_at, now)}" if sub.pause_resumes_at else ""
        return f"Your subscription is paused{until}."
    if sub.cancel_at_period_end and sub.current_period_end:
        return f"Your subscription ends on {day(sub.current_period_end, now)}, as you asked."
    return ""


def access_text(sub: Subscription, cycles: list[DunningCycle], now: datetime) -> AccessText:
    """E.g. "Full access until 7 December; after that read and export only"."""
    debt = _debt_text(sub, cycles, now)
    contract = contract_text(sub, now)
    if not contract:
        return debt
    if sub.contract_phase in ("canceled", "incomplete_expired", "paused"):
        words = summary(sub.entitlement_profile)
        return AccessText(f"{contract} {words[0].upper()}{words[1:]}.", debt.profile)
    return AccessText(f"{debt.headline} {contract}", debt.profile)


def _debt_text(sub: Subscription, cycles: list[DunningCycle], now: datetime) -> AccessText:
    profile = sub.entitlement_profile
    now_words = summary(profile)
    blocking = [c for c in cycles if is_blocking(cycle_view(c))]
    if not blocking:
        return AccessText(f"{now_words[0].upper()}{now_words[1:]}. Thank you, everything is paid.", profile)
    exceptions = [c for c in blocking if c.state == S.EXCEPTION_ACTIVE and c.exception_expires_at]
    if exceptions:
        ends = min(c.exception_expires_at for c in exceptions)
        after = most_restrictive(_after_profile(c) for c in exceptions) or profile
        return AccessText(f"{now_words[0].upper()}{now_words[1:]} until {day(ends, now)}; after that "
                          f"{then_summary(after)}, unless the open invoice is paid.", profile)
    if any(c.state == S.EVIDENCE_CONFLICT for c in blocking):
        return AccessText(f"{now_words[0].upper()}{now_words[1:]}. We are checking a payment that our records show "
                          "two ways; your access stays as it is until our team has looked at it.", profile)
    if any(c.state == S.PAYMENT_UNKNOWN for c in blocking):
        return AccessText(f"{now_words[0].upper()}{now_words[1:]}. We are confirming a payment with your bank; we "
                          "will not charge you again until we know how it ended.", profile)
    in_grace = [c for c in blocking if c.state in GRACE_PROFILE_STATES and c.grace_expires_at]
    if in_grace:
        ends = min(c.grace_expires_at for c in in_grace)
        after = most_restrictive(policy_spec(c.policy).restricted_profile for c in in_grace) or profile
        if ends > now:
            return AccessText(f"{now_words[0].upper()}{now_words[1:]} until {day(ends, now)}; after that "
                              f"{then_summary(after)}, unless the open invoice is paid.", profile)
    return AccessText(f"{now_words[0].upper()}{now_words[1:]}. Pay the open invoice to restore full access.",
                      profile)


# --- how the customer pays, by provider (labels from subscriptions.providers.labels) -------------


@dataclass(frozen=True)
class PaymentWords:
    """The provider-specific words of the page: a Stripe customer pays by card, an Alipay customer
    through a recurring deduction agreement (no card wording for Alipay)."""

    paid_through: str  # "Paid through Stripe"
    retried_on: str  # "We will {retried_on} {date}."
    update_link: str  # the payment page link after the payment method stopped working
    other_way_link: str  # the payment page link next to the button
    pay_page_link: str  # the payment page link when it is the only way
    pay_page_instruction: str  # "No automatic retry is planned: please {…}."
    declined: str  # after a retry was declined
    method_gone: str  # the payment method cannot be used again: what the customer must do
    budget_used: str  # every allowed attempt was made


CARD_WORDS = dict(
    retried_on="try your card again on", update_link="Update payment method", other_way_link="Use another card",
    pay_page_link="Pay on the secure payment page", pay_page_instruction="pay on the secure payment page",
    declined="Your bank declined the payment. Please update your payment method.",
    method_gone="",  # the card wording of subscriptions.billing.actions
    budget_used="",
)
ALIPAY_WORDS = dict(
    retried_on="try the Alipay deduction again on", update_link="Pay in Alipay", other_way_link="Pay in Alipay",
    pay_page_link="Pay in Alipay", pay_page_instruction="pay in Alipay",
    declined="Alipay could not take the payment. Nothing was charged. Please check that your Alipay balance "
             "can cover it, or contact support.",
    method_gone="Your Alipay recurring deduction agreement is no longer active, so we cannot collect this payment. "
                "Nothing was charged. Please sign the deduction agreement again in Alipay; we will then collect "
                "the payment for you.",
    budget_used="We have already tried to collect this payment through Alipay as many times as allowed. Please "
                "check that your Alipay balance can cover it and contact support.",
)


def payment_words(sub: Subscription) -> PaymentWords:
    """ "Paid through Stripe" / "Paid through Alipay (recurring deduction agreement …1234)", and the
    next-step wording of that provider."""
    if sub.provider == "alipay":
        agreement = provider_terms(sub.provider).subscription
        return PaymentWords(f"Paid through Alipay ({agreement} {id_tail(sub.provider_subscription_id)})",
                            **ALIPAY_WORDS)
    return PaymentWords(f"Paid through {provider_label(sub.provider)}", **CARD_WORDS)
