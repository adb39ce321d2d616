"""The needs-review actions (issue 17 item 7) and the wallet's staff credit, as admin views.

Each view checks the permission (billing leads: `agentpay.resolve_review`,
`agentpay.credit_wallet`), parses a form with a reason and a ticket, calls ONE service and says
what happened; it saves nothing itself. A user without the permission sees no button, and a
POST from them is refused (403).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import reverse

from agentpay.models import (
    ChainAuthorization,
    ChainTransaction,
    FulfillmentStatusQuery,
    GatewayRequest,
    IntentReceipt,
    LedgerAccount,
    OutboxMessage,
    PaymentChallenge,
    PaymentIntent,
    RefundObligation,
    Tenant,
    Transfer,
    WebhookAttempt,
)
from agentpay.selectors import intent_display_status
from agentpay.services.acceptance import REVIEW_PERMISSION
from agentpay.services.ledger import LedgerRefusal
from agentpay.services.recovery import review_resolve, review_take_ownership
from agentpay.services.results import Refusal
from agentpay.services.tenants import CustomerLinkRefused, tenant_link_provider_customer
from agentpay.services.topups import CREDIT_PERMISSION, wallet_staff_credit


@dataclass(frozen=True)
class ReviewAction:
    label: str
    permission: str
    explain: str


REVIEW_ACTIONS: dict[str, ReviewAction] = {
    "take_ownership": ReviewAction(
        "Take ownership", REVIEW_PERMISSION,
        "You become this review's owner: colleagues see that you are on it. The previous owner stays named in the "
        "timeline."),
    "delivered": ReviewAction(
        "Delivered — capture", REVIEW_PERMISSION,
        "You attest that the upstream executed this call (say how you know). The fulfillment becomes succeeded, the "
        "hold is captured (the tenant pays), and the intent is completed."),
    "not_delivered": ReviewAction(
        "Not delivered — release", REVIEW_PERMISSION,
        "You attest that the upstream did not execute this call and never will (say how you know). The fulfillment "
        "becomes failed, the hold is released (nothing is billed), and the intent is closed as failed."),
}
CREDIT_ACTION = ReviewAction(
    "Staff credit", CREDIT_PERMISSION,
    "Adds money to this wallet from the staff-credit account (goodwill, a correction). The ledger keeps the amount, "
    "your name, the reason and the ticket; it cannot be edited afterwards.")
LINK_CUSTOMER_ACTION = ReviewAction(
    "Link Stripe customer", CREDIT_PERMISSION,
    "Payments by this Stripe customer that name no tenant will top up this tenant's wallet. Leave the customer "
    "empty to unlink. A customer tops up one tenant only. The change is kept with your name, the reason and the "
    "ticket.")


class ReasonTicketForm(forms.Form):
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
                             help_text="Why, and how you know: kept on the intent's receipts.")
    ticket = forms.CharField(max_length=128, help_text="Ticket reference, e.g. OPS-1234.")


class CustomerLinkForm(ReasonTicketForm):
    customer_ref = forms.CharField(max_length=255, required=False, label="Stripe customer",
                                   help_text="cus_…, as in the Stripe dashboard; empty to unlink.")
    field_order = ["customer_ref", "reason", "ticket"]


class CreditForm(ReasonTicketForm):
    amount = forms.IntegerField(min_value=1, help_text="In minor units (cents), a whole positive number.")
    field_order = ["amount", "reason", "ticket"]


def _require(request: HttpRequest, action: ReviewAction) -> None:
    if not request.user.has_perm(action.permission):
        raise PermissionDenied(f"you may not: {action.label.lower()}")


def _page(request: HttpRequest, model_admin: admin.ModelAdmin, *, obj: Any, action: ReviewAction,
          form: forms.Form, summary: list[tuple[str, Any]], back_url: str) -> TemplateResponse:
    opts = model_admin.model._meta
    return TemplateResponse(request, "admin/agentpay/action.html", {
        **model_admin.admin_site.each_context(request), "title": f"{action.label}: {obj}", "opts": opts,
        "object": obj, "action": action, "form": form, "summary": summary, "back_url": back_url,
        "changelist_url": reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")})


def intent_summary(intent: PaymentIntent) -> list[tuple[str, Any]]:
    owner = intent.review_owner.get_username() if intent.review_owner_id else "nobody yet"
    return [("Intent", intent.intent_id), ("Tenant", intent.tenant),
            ("Amount", f"{intent.amount} {intent.currency.upper()}"),
            ("Display status", intent_display_status(intent)), ("Owner", owner),
            ("Upstream status query", intent.fulfillment.last_status_query_answer or "not asked yet")]


def review_action_view(model_admin: admin.ModelAdmin, request: HttpRequest, object_id: str,
                       key: str) -> HttpResponse:
    if key not in REVIEW_ACTIONS:
        raise PermissionDenied("no such action")
    action = REVIEW_ACTIONS[key]
    _require(request, action)
    intent = get_object_or_404(PaymentIntent.objects.select_related("tenant", "fulfillment", "review_owner"),
                               pk=object_id)
    opts = model_admin.model._meta
    back = reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[intent.pk])
    form = ReasonTicketForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        reason, ticket = form.cleaned_data["reason"], form.cleaned_data["ticket"]
        try:
            if key == "take_ownership":
                review_take_ownership(intent_id=intent.intent_id, user=request.user, reason=reason, ticket=ticket)
                messages.success(request, f"You own the review of {intent.intent_id} now.")
                return redirect(back)
            outcome = review_resolve(intent_id=intent.intent_id, delivered=key == "delivered", user=request.user,
                                     reason=reason, ticket=ticket)
        except Refusal as refusal:
            form.add_error(None, f"Refused ({refusal.code}): {refusal.detail}")
        else:
            if outcome.accepted:
                messages.success(request, f"Intent {intent.intent_id} is {outcome.lines.intent} "
                                          f"({outcome.display_status}).")
                # It left the queue: show it among all intents.
                return redirect(reverse("admin:agentpay_paymentintent_change", args=[intent.pk]))
            form.add_error(None, f"Refused ({outcome.refusal_code}): {outcome.detail}. Nothing changed.")
    return _page(request, model_admin, obj=intent, action=action, form=form, summary=intent_summary(intent),
                 back_url=back)


def wallet_credit_view(model_admin: admin.ModelAdmin, request: HttpRequest, object_id: str) -> HttpResponse:
    _require(request, CREDIT_ACTION)
    wallet = get_object_or_404(LedgerAccount.objects.select_related("tenant"), pk=object_id, kind="wallet")
    back = reverse("admin:agentpay_ledgeraccount_change", args=[wallet.pk])
    form = CreditForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        try:
            transfer = wallet_staff_credit(tenant=wallet.tenant, currency=wallet.currency,
                                           amount=form.cleaned_data["amount"], user=request.user,
                                           reason=form.cleaned_data["reason"], ticket=form.cleaned_data["ticket"])
        except LedgerRefusal as refusal:
            form.add_error(None, f"Refused ({refusal.code}): {refusal.detail}")
        else:
            messages.success(request, f"Credited {transfer.amount} {transfer.currency} to {wallet.tenant} "
                                      f"({transfer.transfer_id}).")
            return redirect(back)
    summary = [("Tenant", wallet.tenant), ("Currency", wallet.currency), ("Available", wallet.available)]
    return _page(request, model_admin, obj=wallet, action=CREDIT_ACTION, form=form, summary=summary, back_url=back)


def tenant_link_customer_view(model_admin: admin.ModelAdmin, request: HttpRequest, object_id: str) -> HttpResponse:
    _require(request, LINK_CUSTOMER_ACTION)
    tenant = get_object_or_404(Tenant, pk=object_id)
    back = reverse("admin:agentpay_tenant_change", args=[tenant.pk])
    form = CustomerLinkForm(request.POST if request.method == "POST" else None,
                            initial={"customer_ref": tenant.provider_customer_ref})
    if request.method == "POST" and form.is_valid():
        try:
            link = tenant_link_provider_customer(tenant_id=tenant.tenant_id, user=request.user,
                                                 customer_ref=form.cleaned_data["customer_ref"],
                                                 reason=form.cleaned_data["reason"], ticket=form.cleaned_data["ticket"])
        except CustomerLinkRefused as refused:
            form.add_error(None, f"Refused ({refused.code}): {refused.detail}")
        else:
            messages.success(request, f"{tenant} is linked to {link.customer_ref or 'no customer'} now "
                                      f"(was {link.previous_ref or 'none'}).")
            return redirect(back)
    summary = [("Tenant", tenant), ("Linked customer now", tenant.provider_customer_ref or "none")]
    return _page(request, model_admin, obj=tenant, action=LINK_CUSTOMER_ACTION, form=form, summary=summary,
                 back_url=back)


@dataclass(frozen=True)
class TimelineRow:
    at: datetime
    kind: str  # receipt, refusal, ledger, request, query, outbox, webhook
    what: str
    detail: str
    who: str = ""


def intent_timeline(intent: PaymentIntent) -> list[TimelineRow]:
    """Receipts (accepted and refused), ledger transfers, the requests, every status query, the
    outbox rows and the webhook POSTs to the tenant, in time order."""
    rows: list[TimelineRow] = []
    for r in IntentReceipt.objects.filter(intent=intent).order_by("pk"):
        moved = f"{r.from_state} → {r.to_state}" if r.accepted else f"refused {r.refusal_code}: {r.detail}"
        note = " · ".join(x for x in (r.reason and f"reason: {r.reason}", r.ticket and f"ticket: {r.ticket}") if x)
        rows.append(TimelineRow(r.trusted_time, "receipt" if r.accepted else "refusal", f"{r.line}.{r.event}",
                                f"{moved}{' · ' + note if note else ''}", r.actor))
    for t in Transfer.objects.filter(intent=intent).order_by("pk"):
        rows.append(TimelineRow(t.created_at, "ledger", f"{t.get_kind_display()} {t.transfer_id}",
                                f"{t.amount} {t.currency}", t.actor))
    for g in GatewayRequest.objects.filter(intent=intent).order_by("received_at"):
        rows.append(TimelineRow(g.received_at, "request", f"{g.method} {g.path[:80]}",
                                f"request_id {g.request_id} → {g.answer_status or '…'} {g.answer_problem}".strip()))
    for q in FulfillmentStatusQuery.objects.filter(fulfillment__intent=intent).order_by("pk"):
        rows.append(TimelineRow(q.asked_at, "query", f"status query → {q.answer}{' (fenced)' if q.fenced else ''}",
                                status_query_detail(q), "upstream"))
    for o in OutboxMessage.objects.filter(intent=intent).order_by("pk"):
        state = f"published {o.published_at:%H:%M:%S}" if o.published_at else "not yet published"
        rows.append(TimelineRow(o.created_at, "outbox", f"{o.topic} #{o.payload.get('generation')}",
                                f"{o.payload.get('display_status', '')} · {state}"))
    for a in WebhookAttempt.objects.filter(delivery__message__intent=intent).select_related("delivery").order_by("pk"):
        rows.append(TimelineRow(a.attempted_at, "webhook", f"POST {a.url[:80]}",
                                f"{a.delivery.dedupe_key} → {a.http_status or a.error[:120]}"))
    rows += chain_timeline(intent)
    return sorted(rows, key=lambda row: row.at)


def chain_timeline(intent: PaymentIntent) -> list[TimelineRow]:
    """The on-chain rail's evidence: the 402 we sent, the authorization the payer signed, every
    transaction we signed (and when we last broadcast and queried it), the refund owed."""
    rows: list[TimelineRow] = []
    challenge = PaymentChallenge.objects.filter(intent=intent).select_related("network").first()
    if challenge is not None:
        rows.append(TimelineRow(challenge.issued_at, "chain", f"402 challenge {challenge.challenge_id}",
                                f"{challenge.amount} atomic units to {challenge.pay_to} on {challenge.network.caip2}; "
                                f"expires {challenge.expires_at:%H:%M:%S}"))
    authorization = ChainAuthorization.objects.filter(intent=intent).first()
    if authorization is not None:
        rows.append(TimelineRow(authorization.received_at, "chain", "authorization signed by the payer",
                                f"{authorization.payer} · nonce {authorization.nonce[:18]}… · valid before "
                                f"{authorization.valid_before}", authorization.payer))
    refund = RefundObligation.objects.filter(intent=intent).first()
    txs = ChainTransaction.objects.filter(Q(settlement__intent=intent) | Q(refund__intent=intent)).order_by("pk")
    for tx in txs:
        seen = (f"block {tx.block_number}, status {tx.receipt_status}" if tx.block_number is not None
                else "no receipt seen")
        rows.append(TimelineRow(tx.signed_at, "chain", f"{tx.purpose} transaction {tx.tx_id} signed",
                                f"{tx.tx_hash} · sender nonce {tx.sender_nonce} · sent {tx.broadcast_attempts}× · "
                                f"{seen} · queried {tx.queries}× ({tx.last_query_answer[:80] or '—'})", tx.sender))
    if refund is not None:
        owner = refund.owner.get_username() if refund.owner_id else "nobody yet"
        rows.append(TimelineRow(refund.created_at, "refund", f"refund owed {refund.refund_id}",
                                f"{refund.amount} atomic units back to {refund.payer} · {refund.state} · owner "
                                f"{owner}"))
    return rows


def status_query_detail(q: FulfillmentStatusQuery) -> str:
    seen = f"HTTP {q.http_status}" if q.http_status else ("timed out" if q.timed_out else "no HTTP answer")
    parts = [seen, f"{q.latency_ms} ms" if q.latency_ms is not None else "", q.error,
             f"proves {q.proves}" if q.proves else "proves nothing",
             f"request_id {q.request_id}" if q.request_id else ""]
    return " · ".join(p for p in parts if p)
