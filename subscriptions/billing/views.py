"""Customer billing pages (SPEC §12): server-rendered, plain words, a customer sees only their
own subscriptions (404 for anyone else's). Every POST carries Django's CSRF token."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from dunning.acceptance.inputs import Cause
from dunning.actions.retry_now import REFUSAL_TEXT, cycle_pay_now, cycle_retry_now
from dunning.clock import trusted_now
from dunning.models import DunningCycle
from subscriptions.billing.actions import invoice_action
from subscriptions.billing.plan_names import interval_words, plan_label, product_name
from subscriptions.billing.usage_card import usage_card
from subscriptions.billing.wording import access_text, limits, moment, money, payment_words
from subscriptions.models import InvoiceStatus, Subscription
from subscriptions.usage_reads import export_csv_lines

OPEN_STATUSES = (InvoiceStatus.OPEN, InvoiceStatus.UNCOLLECTIBLE)
# The retry service's details are for staff; customers read these.
OUTCOME_TEXT = {
    "PAID": "Thank you: the payment went through. Your access is being restored.",
    "DECLINED": "Your bank declined the payment. Please update your payment method.",
    "UNKNOWN": "We sent the payment but have not heard back from your bank yet. We will not charge you twice; "
               "please check this page again in a few minutes.",
}
PAY_OUTCOME_TEXT = {
    **OUTCOME_TEXT,
    "PAID": "Thank you: your payment went through.",
    "DECLINED": "Your bank declined the payment. Nothing was charged. Please add a new card on the secure payment "
                "page.",
}
REFUSED_OTHERWISE = "We could not take this payment just now. Please use the secure payment page or contact support."


def _own_subscriptions(request: HttpRequest):  # noqa: ANN202 - QuerySet[Subscription]
    return Subscription.objects.filter(customer__user=request.user).select_related("customer", "policy")


@login_required
def billing_home(request: HttpRequest) -> HttpResponse:
    subs = list(_own_subscriptions(request).order_by("pk"))
    if len(subs) == 1:
        return redirect("billing-subscription", pk=subs[0].pk)
    plans = [{"pk": sub.pk, "label": plan_label(sub)} for sub in subs]
    return render(request, "billing/home.html", {"plans": plans})


@login_required
def subscription_page(request: HttpRequest, pk: int) -> HttpResponse:
    sub = get_object_or_404(_own_subscriptions(request), pk=pk)
    now = trusted_now()
    cycles = list(DunningCycle.objects.filter(subscription=sub).select_related("invoice", "policy", "pending_attempt"))
    by_invoice = {c.invoice_id: c for c in cycles}
    words = payment_words(sub)
    open_invoices = []
    for inv in sub.invoices.filter(status__in=OPEN_STATUSES).order_by("created_at", "pk"):
        cycle = by_invoice.get(inv.pk)
        next_at = (cycle.next_attempt_at if cycle and cycle.next_attempt_at else inv.next_payment_attempt)
        due = money(max(inv.amount_due - inv.amount_paid, 0), inv.currency)
        open_invoices.append({
            "number": inv.provider_invoice_id,
            "due": due,
            "period": f"{inv.period_start.day} {inv.period_start:%B %Y} – {inv.period_end.day} {inv.period_end:%B %Y}"
                      if inv.period_start and inv.period_end else "",
            "next_retry": moment(next_at, now) if next_at and next_at > now else "",
            "pay_url": inv.hosted_invoice_url,
            "cycle_pk": cycle.pk if cycle else None,
            "action": invoice_action(cycle, amount=due, now=now, words=words),
        })
    access = access_text(sub, cycles, now)
    product = product_name(sub)
    return render(request, "billing/subscription.html", {
        "sub": sub, "words": words, "access": access, "limits": limits(access.profile), "open_invoices": open_invoices,
        "plan": product or interval_words(sub), "billed": interval_words(sub) if product else "",
        "support_email": settings.DUNNING_SUPPORT_EMAIL,
        "usage": usage_card(sub, now, open_invoice=bool(open_invoices)),
    })


@login_required
def usage_export(request: HttpRequest, pk: int) -> StreamingHttpResponse:
    """The customer's own usage as CSV, in every access profile: usage already consumed stays theirs
    to download even when access has ended."""
    sub = get_object_or_404(_own_subscriptions(request), pk=pk)
    response = StreamingHttpResponse(export_csv_lines(sub), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="usage-{sub.pk}.csv"'
    return response


def _own_cycle(request: HttpRequest, pk: int, cycle_pk: int) -> Subscription:
    sub = get_object_or_404(_own_subscriptions(request), pk=pk)
    if not DunningCycle.objects.filter(pk=cycle_pk, subscription=sub).exists():
        raise Http404("no such invoice")
    return sub


def _tell(request: HttpRequest, outcome, texts: dict[str, str]) -> None:  # noqa: ANN001 - RetryOutcome
    if outcome.status == "REFUSED":
        messages.warning(request, REFUSAL_TEXT.get(outcome.code, REFUSED_OTHERWISE))
    elif outcome.status == "PAID":
        messages.success(request, texts["PAID"])
    else:
        messages.info(request, texts.get(outcome.status, REFUSED_OTHERWISE))


@login_required
@require_POST
def retry_now(request: HttpRequest, pk: int, cycle_pk: int) -> HttpResponse:
    """LOCAL retry authority: a local retry now, on the persisted-key path."""
    sub = _own_cycle(request, pk, cycle_pk)
    texts = {**OUTCOME_TEXT, "DECLINED": payment_words(sub).declined}
    _tell(request, cycle_retry_now(cycle_pk=cycle_pk, cause=Cause.customer(request.user)), texts)
    return redirect("billing-subscription", pk=sub.pk)


@login_required
@require_POST
def pay_now(request: HttpRequest, pk: int, cycle_pk: int) -> HttpResponse:
    """Provider retry authority: pay the open invoice through the provider (or, after an
    unanswered payment, ask how it ended — never a second charge)."""
    sub = _own_cycle(request, pk, cycle_pk)
    _tell(request, cycle_pay_now(cycle_pk=cycle_pk, cause=Cause.customer(request.user)), PAY_OUTCOME_TEXT)
    return redirect("billing-subscription", pk=sub.pk)
