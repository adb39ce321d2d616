"""What the subscription page of the support console reads (SPEC §11): blocking cycles, root,
profile and generation, the review verdict, and one timeline merging provider events, provider
receipts, money facts, accepted and rejected transitions and history records.

A fixed number of queries whatever the number of rows: each source is one query, limited to
its newest TIMELINE_LIMIT rows, and merged in Python by time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from dunning.acceptance.aggregate import is_blocking
from dunning.acceptance.settlement import cycle_view
from dunning.actions.provider_cancel import cancellation_state
from dunning.admin.decisions import ACTIONS
from dunning.models import DunningCycle, MonetaryFact, ProviderEvent, ProviderReceipt, TransitionReceipt
from dunning.reads.review import subscription_verdict
from entitlements.profiles import PROFILES
from subscriptions.models import Invoice, Subscription
from subscriptions.providers.labels import dashboard_url, provider_terms

TIMELINE_LIMIT = 100


@dataclass(frozen=True)
class TimelineEntry:
    at: datetime
    kind: str  # event | receipt | fact | accepted | rejected | history
    title: str
    detail: str = ""
    who: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _money(amount: int | None, currency: str) -> str:
    if amount is None:
        return ""
    return f"{amount / 100:,.2f} {currency.upper()}"


def subscription_timeline(sub: Subscription, limit: int = TIMELINE_LIMIT) -> list[TimelineEntry]:
    entries: list[TimelineEntry] = []
    for e in ProviderEvent.objects.filter(subscription=sub).order_by("-received_at").only(
            "event_id", "event_type", "outcome", "outcome_detail", "received_at")[:limit]:
        entries.append(TimelineEntry(e.received_at, "event", f"provider event {e.event_type}",
                                     f"{e.event_id} → {e.outcome} {e.outcome_detail}".strip()))
    for r in ProviderReceipt.objects.filter(invoice__subscription=sub).order_by("-fetched_at").defer("body")[:limit]:
        entries.append(TimelineEntry(r.fetched_at, "receipt", f"provider receipt: {r.object_type} {r.status}",
                                     f"{r.object_id} {_money(r.amount, r.currency)} (receipt #{r.pk})"))
    for f in (MonetaryFact.objects.filter(invoice__subscription=sub).select_related("invoice")
              .order_by("-occurred_at")[:limit]):
        entries.append(TimelineEntry(f.occurred_at, "fact", f"money fact {f.kind}",
                                     f"{f.invoice.provider_invoice_id} {_money(f.amount, f.currency)} "
                                     f"{f.decline_code}".strip()))
    for t in (TransitionReceipt.objects.filter(subscription=sub).select_related("cycle__invoice")
              .order_by("-id")[:limit]):
        invoice = t.cycle.invoice.provider_invoice_id if t.cycle_id else "subscription"
        if t.accepted:
            title = f"accepted {t.edge}: {t.from_state or '—'} → {t.to_state or '—'}"
            detail = f"{invoice}; access {t.decision_profile} generation {t.entitlement_generation}"
        else:
            title = f"rejected {t.edge} ({t.rejection_reason})"
            detail = f"{invoice}; {t.detail}"
        if t.reason or t.ticket:
            detail += f"; reason: {t.reason} ticket: {t.ticket}"
        entries.append(TimelineEntry(t.trusted_time, "accepted" if t.accepted else "rejected", title, detail,
                                     t.actor))
    history = [
        (Subscription.history.filter(id=sub.pk),
         lambda h: f"subscription: access {h.entitlement_profile} generation {h.entitlement_generation}"),
        (DunningCycle.history.filter(subscription_id=sub.pk),
         lambda h: f"cycle {str(h.cycle_id)[:8]}: {h.state} generation {h.generation}"),
        (Invoice.history.filter(subscription_id=sub.pk),
         lambda h: f"invoice {h.provider_invoice_id}: {h.status} revision {h.revision}"),
    ]
    kinds = {"+": "created", "~": "changed", "-": "deleted"}
    for qs, describe in history:
        for h in qs.select_related("history_user").order_by("-history_date")[:limit]:
            who = h.history_user.get_username() if h.history_user_id else ""
            entries.append(TimelineEntry(h.history_date, "history", f"history ({kinds.get(h.history_type, '')})",
                                         describe(h), who))
    entries.sort(key=lambda e: e.at, reverse=True)
    return entries


@dataclass(frozen=True)
class CycleRow:
    cycle: DunningCycle
    blocking: bool
    actions: list[tuple[str, str]]  # (action key, label)

    @property
    def amount(self) -> str:
        return _money(self.cycle.amount, self.cycle.currency)

    @property
    def invoice_term(self) -> str:
        """ "invoice" (Stripe), "deduction order" (Alipay)."""
        return provider_terms(self.cycle.invoice.provider).invoice

    @property
    def invoice_link(self) -> str:
        """The invoice in the provider's own console (Stripe only; "" otherwise)."""
        return dashboard_url(self.cycle.invoice.provider, "invoice", self.cycle.invoice.provider_invoice_id)


def provider_facts(sub: Subscription) -> dict[str, str]:
    """Who collects this subscription, in the provider's own words, with a console link where one exists."""
    terms = provider_terms(sub.provider)
    return {
        "name": sub.provider, "label": terms.label, "account_term": terms.account, "account": sub.provider_account,
        "subscription_term": terms.subscription, "subscription_id": sub.provider_subscription_id,
        "link": dashboard_url(sub.provider, "subscription", sub.provider_subscription_id),
    }


def subscription_console(sub: Subscription, *, allowed: dict[str, bool]) -> dict[str, Any]:
    """Everything the subscription page shows above the standard fields."""
    cycles = list(DunningCycle.objects.filter(subscription=sub)
                  .select_related("invoice", "policy", "unknown_owner", "pending_attempt")
                  .order_by("-opened_at", "-pk"))
    rows = []
    for cycle in cycles:
        actions = [(key, a.label) for key, a in ACTIONS.items()
                   if a.for_cycle and cycle.state in a.states and allowed.get(key)]
        rows.append(CycleRow(cycle, is_blocking(cycle_view(cycle)), actions))
    verdict = subscription_verdict(sub)
    profile = PROFILES.get(sub.entitlement_profile)
    return {
        "console_sub": sub,
        "console_provider": provider_facts(sub),
        "console_blocking": [r for r in rows if r.blocking],
        "console_settled": [r for r in rows if not r.blocking],
        "console_profile_summary": profile.summary if profile else sub.entitlement_profile,
        "console_verdict": verdict,
        "console_cancellation": cancellation_state(sub),
        "console_timeline": subscription_timeline(sub),
        "console_sub_actions": [(key, a.label) for key, a in ACTIONS.items()
                                if not a.for_cycle and allowed.get(key)],
    }
