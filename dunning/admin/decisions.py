"""Staff decisions on the subscription page (SPEC §11): each asks for a reason and a ticket on
an intermediate form page, calls ONE service of `dunning.actions.support`, and reports what it
did. An action the user may not take is neither shown nor accepted (403 on a crafted POST).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

from dunning.actions import support
from dunning.actions.incidents import IncidentError
from dunning.clock import trusted_now
from dunning.models import DunningCycle, ProviderReceipt
from dunning.policy.cache import policy_spec
from dunning.states import CONFLICT_RESOLUTIONS, EXCEPTION_SOURCE_STATES, CycleState
from entitlements.profiles import FULL, PROFILES, REVOKED
from subscriptions.models import Subscription

S = CycleState


class DecisionForm(forms.Form):
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
                             help_text="Why: this goes into the audit receipt.")
    ticket = forms.CharField(max_length=128, help_text="Ticket reference, e.g. SUP-1234.")

    def __init__(self, *args: Any, cycle: DunningCycle | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cycle = cycle


class GrantExceptionForm(DecisionForm):
    expires_at = forms.DateTimeField(
        label="Expires at (UTC)", widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
        help_text="Mandatory. Access returns to what the debt asks for at this time.")
    profile = forms.ChoiceField(choices=[(n, f"{n} — {p.summary}") for n, p in PROFILES.items() if n != REVOKED],
                                initial=FULL, label="Access during the exception")
    owner = forms.CharField(required=False, max_length=150, help_text="Who follows up; you if left empty.")
    field_order = ["expires_at", "profile", "owner", "reason", "ticket"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.cycle is not None:
            limit = policy_spec(self.cycle.policy).exception_max_duration
            latest = trusted_now() + limit
            self.max_expiry = latest
            self.fields["expires_at"].help_text += (
                f" The policy allows at most {limit.days} days: no later than {latest:%Y-%m-%d %H:%M} UTC.")
            self.fields["expires_at"].widget.attrs["max"] = latest.strftime("%Y-%m-%dT%H:%M")

    def clean_expires_at(self):  # noqa: ANN201
        value = self.cleaned_data["expires_at"]
        now = trusted_now()
        if value <= now:
            raise forms.ValidationError("The expiry must be in the future.")
        if getattr(self, "max_expiry", None) and value > self.max_expiry + timedelta(minutes=1):
            raise forms.ValidationError(f"The policy allows an exception until {self.max_expiry:%Y-%m-%d %H:%M} "
                                        "UTC at the latest.")
        return value


RESOLUTION_LABELS = {
    S.RECOVERED: "Paid — the fresh receipt shows the invoice paid (recover)",
    S.CLOSED_VOID: "Void — the invoice is voided, no debt (close)",
    S.GRACE_ACTIVE: "Unpaid — back to grace",
    S.RESTRICTED: "Unpaid — restrict",
}


class ResolveConflictForm(DecisionForm):
    resolution = forms.ChoiceField(choices=[(r, RESOLUTION_LABELS[r]) for r in RESOLUTION_LABELS
                                            if r in CONFLICT_RESOLUTIONS],
                                   widget=forms.RadioSelect)
    field_order = ["resolution", "reason", "ticket"]


class ResolveUnknownForm(DecisionForm):
    decision = forms.ChoiceField(
        choices=[("PAID", "Paid — the fresh receipt shows the invoice paid"),
                 ("FAILED", "Failed — the invoice is unpaid and none of its payments succeeded")],
        widget=forms.RadioSelect,
        help_text="The invoice and its payments are fetched fresh when you submit; a decision they contradict is "
                  "refused. The same attempt is resolved; nothing is charged.")
    field_order = ["decision", "reason", "ticket"]


Outcome = tuple[bool, str]


def _audit(data: dict[str, Any]) -> dict[str, str]:
    """The reason and ticket every decision form asks for, as the support services take them."""
    return {"reason": data["reason"], "ticket": data["ticket"]}


def _result_text(result: Any, what: str) -> Outcome:
    if result.accepted:
        moved = f" ({result.from_state} → {result.to_state})" if result.from_state else ""
        return True, (f"{what}{moved}. Access is now {result.profile}, generation {result.entitlement_generation}; "
                      f"audit receipt #{result.receipt_id}.")
    return False, f"Refused: {result.reason} — {result.detail}"


def _decision_text(decision: Any, what: str) -> Outcome:
    """A decision checked against a fresh receipt: its result, and the receipt it was read on."""
    fresh = decision.fresh_receipt
    seen = f" on a fresh receipt showing {fresh.status} (receipt #{fresh.pk})" if fresh else ""
    return _result_text(decision.result, f"{what}{seen}")


def _grant(user: Any, sub: Subscription, cycle: DunningCycle, data: dict[str, Any]) -> Outcome:
    result = support.cycle_grant_exception(cycle_pk=cycle.pk, user=user, expires_at=data["expires_at"],
                                           owner=data.get("owner", ""), profile=data["profile"], **_audit(data))
    return _result_text(result, f"Granted an exception on invoice {cycle.invoice.provider_invoice_id} until "
                                f"{data['expires_at']:%Y-%m-%d %H:%M} UTC")


def _resolve(user: Any, sub: Subscription, cycle: DunningCycle, data: dict[str, Any]) -> Outcome:
    decision = support.cycle_resolve_conflict(cycle_pk=cycle.pk, user=user, resolution=data["resolution"],
                                              **_audit(data))
    return _decision_text(decision, f"Resolved the conflict on invoice {cycle.invoice.provider_invoice_id} as "
                                    f"{data['resolution']}")


def _own(user: Any, sub: Subscription, cycle: DunningCycle, data: dict[str, Any]) -> Outcome:
    result = support.cycle_take_unknown_ownership(cycle_pk=cycle.pk, user=user, **_audit(data))
    return _result_text(result, f"You now own the unknown payment on invoice {cycle.invoice.provider_invoice_id}")


def _resolve_unknown(user: Any, sub: Subscription, cycle: DunningCycle, data: dict[str, Any]) -> Outcome:
    decision = support.cycle_resolve_unknown(cycle_pk=cycle.pk, user=user, decision=data["decision"],
                                             **_audit(data))
    return _decision_text(decision, f"Resolved the unknown payment on invoice {cycle.invoice.provider_invoice_id} as "
                                    f"{data['decision']}")


def _cancel(user: Any, sub: Subscription, cycle: DunningCycle, data: dict[str, Any]) -> Outcome:
    result = support.cycle_request_cancellation(cycle_pk=cycle.pk, user=user, **_audit(data))
    return _result_text(result, f"Requested cancellation for invoice {cycle.invoice.provider_invoice_id}; it "
                                "completes only on a fresh receipt showing the invoice still unpaid")


def _pause(user: Any, sub: Subscription, cycle: None, data: dict[str, Any]) -> Outcome:
    try:
        switch = support.subscription_pause_restrictions(subscription_pk=sub.pk, user=user, **_audit(data))
    except IncidentError as exc:
        return False, f"Refused: {exc}"
    return True, (f"Paused new restrictions and automatic cancellations for cohort {switch.cohort!r} "
                  f"(incident {switch.ticket}). End it with “End incident” on this page.")


def _end_incident(user: Any, sub: Subscription, cycle: None, data: dict[str, Any]) -> Outcome:
    try:
        switch, outcome = support.subscription_end_incident(subscription_pk=sub.pk, user=user, **_audit(data))
    except IncidentError as exc:
        return False, f"Refused: {exc}"
    refused = f"; {len(outcome.refused)} refused: {', '.join(outcome.refused[:5])}" if outcome.refused else ""
    return not outcome.refused, (f"Ended incident {switch.ticket} for cohort {switch.cohort!r}: "
                                 f"{outcome.changed} subscriptions got a fresh entitlement generation{refused}.")


def _rebind(user: Any, sub: Subscription, cycle: None, data: dict[str, Any]) -> Outcome:
    try:
        result = support.subscription_rebind_to_previous(subscription_pk=sub.pk, user=user, **_audit(data))
    except IncidentError as exc:
        return False, f"Refused: {exc}"
    return _result_text(result, f"Rebound {sub.provider_subscription_id} to the previous policy version")


@dataclass(frozen=True)
class ConsoleAction:
    label: str
    permission: str
    run: Callable[[Any, Subscription, Any, dict[str, Any]], Outcome]
    form: type[DecisionForm] = DecisionForm
    states: frozenset[str] = frozenset()
    for_cycle: bool = True
    explain: str = ""


ACTIONS: dict[str, ConsoleAction] = {
    "grant_exception": ConsoleAction(
        "Grant exception", "dunning.grant_exception", _grant, GrantExceptionForm, frozenset(EXCEPTION_SOURCE_STATES),
        explain="Suspends dunning on this invoice until the expiry; access follows the profile you choose."),
    "resolve_conflict": ConsoleAction(
        "Resolve conflict", "dunning.resolve_conflict", _resolve, ResolveConflictForm,
        frozenset({S.EVIDENCE_CONFLICT}),
        explain="The invoice is fetched fresh from the provider again when you submit; a resolution the fresh "
                "receipt contradicts is refused."),
    "own_unknown_payment": ConsoleAction(
        "Take ownership", "dunning.own_unknown_payment", _own, states=frozenset({S.PAYMENT_UNKNOWN}),
        explain="You become the owner of this payment whose outcome is unknown. It is never cancelled."),
    "resolve_unknown_payment": ConsoleAction(
        "Resolve unknown payment", "dunning.own_unknown_payment", _resolve_unknown, ResolveUnknownForm,
        frozenset({S.PAYMENT_UNKNOWN}),
        explain="For a payment whose outcome stayed unknown past the provider's key retention. Only its owner or a "
                "billing lead may decide, and only as the fresh receipt shows."),
    "request_cancellation": ConsoleAction(
        "Request cancellation", "dunning.request_cancellation", _cancel, states=frozenset({S.RESTRICTED}),
        explain="Moves the restricted cycle to cancel pending."),
    "pause_restrictions": ConsoleAction(
        "Pause restrictions (incident)", "dunning.incident_switch", _pause, for_cycle=False,
        explain="Starts the incident switch for this subscription's cohort: no new restrictions or automatic "
                "cancellations until it ends."),
    "end_incident": ConsoleAction(
        "End incident", "dunning.incident_switch", _end_incident, for_cycle=False,
        explain="Ends the incident pausing this subscription's cohort; every subscription of the cohort gets a "
                "fresh entitlement generation so caches re-read access under normal rules."),
    "rebind_policy": ConsoleAction(
        "Rebind to previous policy", "dunning.rebind_policy", _rebind, for_cycle=False,
        explain="Binds this subscription and its open cycles to the policy version published before its own."),
}


def allowed_actions(user: Any) -> dict[str, bool]:
    return {key: user.has_perm(action.permission) for key, action in ACTIONS.items()}


class ConsoleActionsMixin:
    """For SubscriptionAdmin: the action pages under <pk>/console/<action>/[<cycle>/]."""

    admin_site: admin.AdminSite

    def get_urls(self):  # noqa: ANN201
        prefix = f"{self.model._meta.app_label}_{self.model._meta.model_name}"
        view = self.admin_site.admin_view(self.console_action_view)
        return [
            path("<int:object_id>/console/<str:action>/<int:cycle_pk>/", view, name=f"{prefix}_console_cycle"),
            path("<int:object_id>/console/<str:action>/", view, name=f"{prefix}_console"),
            *super().get_urls(),
        ]

    def console_action_view(self, request: HttpRequest, object_id: int, action: str,
                            cycle_pk: int | None = None) -> HttpResponse:
        spec = ACTIONS.get(action)
        if spec is None:
            raise Http404("no such action")
        if not request.user.has_perm(spec.permission):
            raise PermissionDenied(f"you may not {spec.label.lower()}")
        sub = get_object_or_404(Subscription.objects.select_related("customer", "policy"), pk=object_id)
        if not self.has_view_permission(request, sub):
            raise PermissionDenied
        cycle = None
        if spec.for_cycle:
            if cycle_pk is None:
                raise Http404("this action needs a cycle")
            cycle = get_object_or_404(DunningCycle.objects.select_related("invoice", "policy", "pending_attempt"),
                                      pk=cycle_pk, subscription=sub)
        back = reverse("admin:subscriptions_subscription_change", args=[sub.pk])
        form = spec.form(request.POST if request.method == "POST" else None, cycle=cycle)
        if request.method == "POST" and form.is_valid():
            if cycle is not None and cycle.state not in spec.states:
                form.add_error(None, f"This cycle is {cycle.state} now; {spec.label.lower()} needs "
                                     f"{' or '.join(sorted(spec.states))}.")
            else:
                ok, text = spec.run(request.user, sub, cycle, form.cleaned_data)
                if ok:
                    self.message_user(request, text, messages.SUCCESS)
                    return redirect(back)
                form.add_error(None, text)
                self.message_user(request, text, messages.ERROR)
        context = {
            **self.admin_site.each_context(request),
            "title": f"{spec.label}: {sub.provider_subscription_id}",
            "opts": self.model._meta, "subscription": sub, "cycle": cycle, "action": spec, "action_key": action,
            "form": form, "back_url": back,
        }
        if action == "resolve_conflict" and cycle is not None:
            context["older_receipt"] = (ProviderReceipt.objects.filter(invoice_id=cycle.invoice_id)
                                        .order_by("-fetched_at", "-pk").first())
            context["fresh_receipt"] = support.cycle_conflict_fresh_receipt(cycle_pk=cycle.pk)
        return TemplateResponse(request, "admin/dunning/console_action.html", context)
