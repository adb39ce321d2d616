"""Admin pages for operations: job runs, alerts, reconciliation reports, incidents, notification
deliveries, and the two decisions of issue 15 taken here:

- alerts are acknowledged (the user owns them from then on) and resolved with a note, from the
  alert list (actions on the selected alerts) or the alert page; `dunning.actions.alerts`;
- a held provider event (quarantined or unattributable) is fetched again and re-processed by a
  billing lead with a reason and a ticket, from the event page (`EventReprocessMixin`, used by
  ProviderEventAdmin in dunning/admin/records.py); `dunning.evidence.reprocessing`.

Each view parses a form, calls ONE service and says what happened; it saves nothing itself. An
action the user may not take is not shown and is refused (403). Incidents are started and ended
through `dunning.actions.incidents` (the support console's actions).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.text import Truncator

from dunning.actions.alerts import AlertRefused, alert_acknowledge, alert_resolve_by_staff
from dunning.admin.base import ViewOnlyAdmin
from dunning.admin.filters import AlertStatusFilter
from dunning.evidence.reprocessing import HELD_OUTCOMES, ReprocessRefused, event_reprocess
from dunning.models import Alert, IncidentSwitch, JobRun, NotificationDelivery, ProviderEvent, ReconciliationReport
from dunning.models.alert_delivery import AlertDelivery
from dunning.models.inbox import EventReprocessing
from dunning.models.operations import AlertAction

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OperationAction:
    label: str
    permission: str
    explain: str


OPERATION_ACTIONS: dict[str, OperationAction] = {
    "reprocess_event": OperationAction(
        "Fetch again and re-process", "dunning.reprocess_event",
        "The provider's invoice, payment or subscription this event names is fetched again now, and the event goes "
        "through normal processing on that fresh answer (the event's own body is never taken as evidence). The "
        "first outcome stays on record with your reason and ticket. If the provider still does not know the object, "
        "the event stays held."),
    "acknowledge_alert": OperationAction(
        "Acknowledge — take ownership", "dunning.acknowledge_alert",
        "You become the owner of this alert: colleagues see that you are on it. If someone else owns it, you take "
        "it over (they stay named in the trail)."),
    "resolve_alert": OperationAction(
        "Resolve", "dunning.resolve_alert",
        "Closes the alert. Say what was done (refunded the extra charge, checked with the provider, …): the note is "
        "kept in the alert's trail."),
}


def allowed_operations(user: Any) -> dict[str, bool]:
    return {key: user.has_perm(action.permission) for key, action in OPERATION_ACTIONS.items()}


def _require(request: HttpRequest, key: str) -> OperationAction:
    action = OPERATION_ACTIONS[key]
    if not request.user.has_perm(action.permission):
        raise PermissionDenied(f"you may not {action.label.lower()}")
    return action


class ReasonTicketForm(forms.Form):
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
                             help_text="Why: kept with the event's re-processing record.")
    ticket = forms.CharField(max_length=128, help_text="Ticket reference, e.g. SUP-1234.")


class AcknowledgeForm(forms.Form):
    note = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
                           help_text="Optional: what you are about to do.")


class ResolveForm(forms.Form):
    note = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 60}), label="What was done",
                           help_text="Required: kept in the alert's trail.")


def _action_page(request: HttpRequest, model_admin: admin.ModelAdmin, *, obj: Any, action: OperationAction,
                 form: forms.Form, summary: list[tuple[str, Any]], back_url: str,
                 extra: dict[str, Any] | None = None) -> TemplateResponse:
    opts = model_admin.model._meta
    context = {
        **model_admin.admin_site.each_context(request),
        "title": f"{action.label}: {obj}", "opts": opts, "object": obj, "action": action, "form": form,
        "summary": summary, "back_url": back_url,
        "changelist_url": reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist"), **(extra or {}),
    }
    return TemplateResponse(request, "admin/dunning/operations_action.html", context)


# --------------------------------------------------------------------------- provider events


def event_object_ref(event: ProviderEvent) -> str:
    """What the event names at the provider (the object that is fetched again)."""
    try:
        obj = event.payload["data"]["object"]
        return f"{obj.get('object') or 'object'} {obj.get('id') or '(no id)'}"
    except (KeyError, TypeError):
        return "(the event names no object)"


class EventReprocessMixin:
    """For ProviderEventAdmin: why each event was held, and "Fetch again and re-process" for
    billing leads (the event page, and <pk>/reprocess/)."""

    admin_site: admin.AdminSite
    model: type[ProviderEvent]
    change_form_template = "admin/dunning/providerevent/change_form.html"

    def get_urls(self):  # noqa: ANN201
        view = self.admin_site.admin_view(self.reprocess_view)
        return [path("<int:object_id>/reprocess/", view, name="dunning_providerevent_reprocess"),
                *super().get_urls()]

    def get_list_display(self, request: HttpRequest):  # noqa: ANN201
        """For billing leads, a held event's "why" ends with its Re-process button (in the reason's
        column, so it stays in view on a narrow list)."""
        shown = list(super().get_list_display(request))
        if request.user.has_perm(OPERATION_ACTIONS["reprocess_event"].permission) and "why" in shown:
            shown[shown.index("why")] = self.why_and_reprocess
        return shown

    @admin.display(description="why held / what happened")
    def why_and_reprocess(self, event: ProviderEvent) -> str:
        button = self.reprocess_link(event)
        return format_html("{}<br>{}", self.why(event), button) if button else self.why(event)

    @admin.display(description="event", ordering="event_type")
    def event_label(self, event: ProviderEvent) -> str:
        return format_html('{}<br><small class="event-id">{}</small>', event.event_type, event.event_id)

    @admin.display(description="received (UTC)", ordering="received_at")
    def received(self, event: ProviderEvent) -> str:
        return format_html('<span style="white-space:nowrap">{}</span>', f"{event.received_at:%Y-%m-%d %H:%M}")

    @admin.display(description="outcome", ordering="outcome")
    def outcome_badge(self, event: ProviderEvent) -> str:
        if event.outcome in HELD_OUTCOMES:
            return format_html('<strong class="held-outcome" style="color:#b00020">{}</strong>', event.outcome)
        return event.outcome

    @admin.display(description="why held / what happened")
    def why(self, event: ProviderEvent) -> str:
        text = event.outcome_detail or ("(no reason recorded)" if event.outcome in HELD_OUTCOMES else "—")
        why = format_html('<span title="{}">{}</span>', text, Truncator(text).chars(140))
        if event.subscription_id is None:
            return why
        return format_html('{}<br><small>subscription {}</small>', why, event.subscription.provider_subscription_id)

    @admin.display(description="")
    def reprocess_link(self, event: ProviderEvent) -> str:
        if event.outcome not in HELD_OUTCOMES:
            return ""
        url = reverse("admin:dunning_providerevent_reprocess", args=[event.pk])
        return format_html('<a class="button reprocess-link" href="{}">{}…</a>', url,
                           OPERATION_ACTIONS["reprocess_event"].label)

    def change_view(self, request, object_id, form_url="", extra_context=None):  # noqa: ANN001, ANN201
        extra_context = dict(extra_context or {})
        event = ProviderEvent.objects.filter(pk=object_id).first() if str(object_id).isdigit() else None
        if event is not None:
            extra_context.update(
                event_held=event.outcome in HELD_OUTCOMES, event_object=event_object_ref(event),
                event_reprocessings=list(EventReprocessing.objects.filter(event=event)
                                         .order_by("-requested_at", "-pk")[:50]),
                can_reprocess=request.user.has_perm(OPERATION_ACTIONS["reprocess_event"].permission),
                reprocess_action=OPERATION_ACTIONS["reprocess_event"], reprocess_form=ReasonTicketForm(),
                reprocess_url=reverse("admin:dunning_providerevent_reprocess", args=[event.pk]),
            )
        return super().change_view(request, object_id, form_url, extra_context)  # type: ignore[misc]

    def reprocess_view(self, request: HttpRequest, object_id: int) -> HttpResponse:
        action = _require(request, "reprocess_event")
        event = get_object_or_404(ProviderEvent, pk=object_id)
        back = reverse("admin:dunning_providerevent_change", args=[event.pk])
        form = ReasonTicketForm(request.POST if request.method == "POST" else None)
        if request.method == "POST" and form.is_valid():
            try:
                outcome = event_reprocess(event_pk=event.pk, user=request.user, reason=form.cleaned_data["reason"],
                                          ticket=form.cleaned_data["ticket"])
            except ReprocessRefused as refused:
                form.add_error(None, f"Refused: {refused.detail}")
            except Exception as exc:  # recorded on the audit row (FAILED) by the service; say so plainly
                log.exception("re-processing event %s from the admin failed", event.event_id)
                form.add_error(None, f"Re-processing failed on our side ({type(exc).__name__}: {exc}). The event "
                                     f"keeps its outcome; an attempt that started is listed as FAILED under "
                                     f"Event re-processings.")
            else:
                level = messages.SUCCESS if outcome.provider_answered and not outcome.still_held else messages.WARNING
                self.message_user(request, outcome.summary(), level)  # type: ignore[attr-defined]
                return redirect(back)
        summary = [("Event", f"{event.event_type} {event.event_id}"),
                   ("Received", f"{event.received_at:%Y-%m-%d %H:%M:%S} UTC"),
                   ("Names at the provider", event_object_ref(event)),
                   ("Outcome now", event.outcome), ("Why", event.outcome_detail or "—")]
        return _action_page(request, self, obj=event, action=action, form=form, summary=summary,  # type: ignore
                            back_url=back, extra={"refuse_note": "" if event.outcome in HELD_OUTCOMES else
                                                  f"This event is {event.outcome}, not held: it cannot be "
                                                  f"re-processed."})


@admin.register(EventReprocessing)
class EventReprocessingAdmin(ViewOnlyAdmin):
    """Every staff request to fetch a held event again: who, when, why, before and after."""

    list_display = ("requested_at", "event", "actor", "ticket", "previous_outcome", "status", "new_outcome")
    list_filter = ("status", "previous_outcome", "new_outcome")
    list_select_related = ("event",)
    search_fields = ("event__event_id", "ticket", "actor")
    readonly_fields = [f.name for f in EventReprocessing._meta.fields]


# --------------------------------------------------------------------------- alerts


def alert_status_text(alert: Alert) -> str:
    if alert.resolved_at is not None:
        return f"Resolved by {alert.resolved_by} at {alert.resolved_at:%Y-%m-%d %H:%M} UTC"
    if alert.owner_id is not None:
        return f"Open — {alert.owner.get_username()} owns it (since {alert.acknowledged_at:%Y-%m-%d %H:%M} UTC)"
    return "Open — nobody owns it yet"


def alert_next_step(alert: Alert) -> str:
    if alert.resolved_at is not None:
        return ""
    if alert.needs_a_person:
        return "The jobs cannot tell when this is over: it stays open until a person resolves it with a note."
    return "The alerts job resolves this by itself once the condition clears; you may resolve it earlier with a note."


@admin.register(Alert)
class AlertAdmin(ViewOnlyAdmin):
    list_display = ("kind_label", "status", "short_detail", "seen")
    list_filter = (AlertStatusFilter, "kind")
    search_fields = ("dedupe_key", "detail", "invoice__provider_invoice_id",
                     "subscription__provider_subscription_id")
    list_select_related = ("subscription", "invoice", "owner")
    ordering = ("-raised_at", "-pk")
    fields = ("kind", "detail", "subscription", "invoice", "raised_at", "last_seen_at", "occurrences", "owner",
              "acknowledged_at", "resolved_at", "resolved_by", "resolution_note", "dedupe_key", "figures")
    readonly_fields = fields
    actions = ["acknowledge_selected", "resolve_selected"]
    change_form_template = "admin/dunning/alert/change_form.html"

    def has_acknowledge_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(OPERATION_ACTIONS["acknowledge_alert"].permission)

    def has_resolve_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(OPERATION_ACTIONS["resolve_alert"].permission)

    @admin.display(description="alert", ordering="kind")
    def kind_label(self, alert: Alert) -> str:
        return alert.get_kind_display()

    @admin.display(description="status", ordering="resolved_at")
    def status(self, alert: Alert) -> str:
        if alert.resolved_at is not None:
            return format_html('<span style="color:#1b7f3b">resolved</span> by {}', alert.resolved_by)
        if alert.owner_id is not None:
            return format_html("<strong>open</strong> — {}", alert.owner.get_username())
        return format_html('<strong style="color:#b00020">{}</strong>', "open — nobody owns it")

    @admin.display(description="what was seen")
    def short_detail(self, alert: Alert) -> str:
        return format_html('<span title="{}">{}</span>', alert.detail, Truncator(alert.detail).chars(220))

    @admin.display(description="raised (UTC)", ordering="raised_at")
    def seen(self, alert: Alert) -> str:
        again = f", seen {alert.occurrences}×" if alert.occurrences > 1 else ""
        return format_html('<span style="white-space:nowrap">{}</span>{}', f"{alert.raised_at:%Y-%m-%d %H:%M}", again)

    def get_urls(self):  # noqa: ANN201
        wrap = self.admin_site.admin_view
        return [
            path("<int:object_id>/acknowledge/", wrap(self.acknowledge_view), name="dunning_alert_acknowledge"),
            path("<int:object_id>/resolve/", wrap(self.resolve_view), name="dunning_alert_resolve"),
            *super().get_urls(),
        ]

    def change_view(self, request, object_id, form_url="", extra_context=None):  # noqa: ANN001, ANN201
        extra_context = dict(extra_context or {})
        alert = (Alert.objects.select_related("owner").filter(pk=object_id).first()
                 if str(object_id).isdigit() else None)
        if alert is not None:
            allowed = allowed_operations(request.user)
            is_open = alert.resolved_at is None
            extra_context.update(
                alert_obj=alert, alert_status=alert_status_text(alert), alert_next_step=alert_next_step(alert),
                alert_trail=list(AlertAction.objects.filter(alert=alert).order_by("at", "pk")),
                alert_deliveries=list(AlertDelivery.objects.filter(alert=alert).prefetch_related("tries")
                                      .order_by("channel")),
                can_acknowledge=is_open and allowed["acknowledge_alert"] and alert.owner_id != request.user.pk,
                can_resolve=is_open and allowed["resolve_alert"], acknowledge_form=AcknowledgeForm(),
                resolve_form=ResolveForm(), acknowledge_url=reverse("admin:dunning_alert_acknowledge", args=[alert.pk]),
                resolve_url=reverse("admin:dunning_alert_resolve", args=[alert.pk]),
                acknowledge_action=OPERATION_ACTIONS["acknowledge_alert"],
                resolve_action=OPERATION_ACTIONS["resolve_alert"],
            )
        return super().change_view(request, object_id, form_url, extra_context)

    def _alert_summary(self, alert: Alert) -> list[tuple[str, Any]]:
        return [("Alert", alert.get_kind_display()), ("What was seen", alert.detail),
                ("Raised", f"{alert.raised_at:%Y-%m-%d %H:%M} UTC, seen {alert.occurrences}×"),
                ("Status", alert_status_text(alert))]

    def _decide(self, request: HttpRequest, object_id: int, key: str, form_class: type[forms.Form],
                decide: Any) -> HttpResponse:
        action = _require(request, key)
        alert = get_object_or_404(Alert.objects.select_related("owner"), pk=object_id)
        back = reverse("admin:dunning_alert_change", args=[alert.pk])
        form = form_class(request.POST if request.method == "POST" else None)
        if request.method == "POST" and form.is_valid():
            try:
                decision = decide(alert_pk=alert.pk, user=request.user, note=form.cleaned_data["note"])
            except AlertRefused as refused:
                form.add_error(None, f"Refused: {refused.detail}")
            else:
                self.message_user(request, decision.text, messages.SUCCESS)
                return redirect(back)
        return _action_page(request, self, obj=alert, action=action, form=form, summary=self._alert_summary(alert),
                            back_url=back)

    def acknowledge_view(self, request: HttpRequest, object_id: int) -> HttpResponse:
        return self._decide(request, object_id, "acknowledge_alert", AcknowledgeForm, alert_acknowledge)

    def resolve_view(self, request: HttpRequest, object_id: int) -> HttpResponse:
        return self._decide(request, object_id, "resolve_alert", ResolveForm, alert_resolve_by_staff)

    @admin.action(description="Acknowledge — take ownership of the selected alerts", permissions=["acknowledge"])
    def acknowledge_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        taken, refused = [], []
        for alert in queryset.order_by("pk"):
            try:
                decision = alert_acknowledge(alert_pk=alert.pk, user=request.user)
            except AlertRefused as exc:
                refused.append(f"{alert.dedupe_key}: {exc.detail}")
                continue
            if decision.action is not None:
                taken.append(alert.dedupe_key)
        if taken:
            self.message_user(request, f"You now own {len(taken)} alert(s): {', '.join(taken)}.", messages.SUCCESS)
        elif not refused:
            self.message_user(request, "You already own the selected alerts.", messages.INFO)
        if refused:
            self.message_user(request, f"Not acknowledged: {'; '.join(refused)}", messages.WARNING)

    @admin.action(description="Resolve the selected alerts (with a note)…", permissions=["resolve"])
    def resolve_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        alerts = list(queryset.select_related("owner").order_by("pk"))
        form = ResolveForm(request.POST if request.POST.get("confirm") == "yes" else None)
        if form.is_bound and form.is_valid():
            done, refused = [], []
            for alert in alerts:
                try:
                    alert_resolve_by_staff(alert_pk=alert.pk, user=request.user, note=form.cleaned_data["note"])
                except AlertRefused as exc:
                    refused.append(f"{alert.dedupe_key}: {exc.detail}")
                else:
                    done.append(alert.dedupe_key)
            if done:
                self.message_user(request, f"Resolved {len(done)} alert(s): {', '.join(done)}.", messages.SUCCESS)
            if refused:
                self.message_user(request, f"Not resolved: {'; '.join(refused)}", messages.WARNING)
            return None
        context = {
            **self.admin_site.each_context(request), "title": "Resolve alerts", "opts": self.model._meta,
            "alerts": alerts, "form": form, "action_checkbox_name": ACTION_CHECKBOX_NAME,
            "action": OPERATION_ACTIONS["resolve_alert"],
        }
        return TemplateResponse(request, "admin/dunning/alert/resolve_selected.html", context)


@admin.register(JobRun)
class JobRunAdmin(ViewOnlyAdmin):
    list_display = ("job", "run_for", "status", "examined", "changed", "refused", "errors", "duration", "worker")
    list_filter = ("job", "status")
    date_hierarchy = "run_for"
    readonly_fields = [f.name for f in JobRun._meta.fields]

    @admin.display(description="took")
    def duration(self, run: JobRun) -> str:
        if run.finished_at is None:
            return "running"
        return f"{(run.finished_at - run.started_at).total_seconds():.2f} s"


@admin.register(ReconciliationReport)
class ReconciliationReportAdmin(ViewOnlyAdmin):
    list_display = ("window_start", "window_end", "created_at", "discrepancy_count")
    readonly_fields = ("run_for", "window_start", "window_end", "created_at", "totals_table", "discrepancy_list")
    exclude = ("totals", "discrepancies")

    @admin.display(description="discrepancies")
    def discrepancy_count(self, report: ReconciliationReport) -> int:
        return len(report.discrepancies)

    @admin.display(description="totals")
    def totals_table(self, report: ReconciliationReport) -> str:
        return format_html("<pre>{}</pre>", json.dumps(report.totals, indent=2, sort_keys=True, default=str))

    @admin.display(description="discrepancies")
    def discrepancy_list(self, report: ReconciliationReport) -> str:
        return format_html("<pre>{}</pre>", json.dumps(report.discrepancies, indent=2, default=str))


@admin.register(IncidentSwitch)
class IncidentSwitchAdmin(ViewOnlyAdmin):
    list_display = ("ticket", "cohort", "pause_restrictions", "started_at", "started_by", "ended_at", "ended_by")
    list_filter = (("ended_at", admin.EmptyFieldListFilter),)
    readonly_fields = [f.name for f in IncidentSwitch._meta.fields]


@admin.register(NotificationDelivery)
class NotificationDeliveryAdmin(ViewOnlyAdmin):
    list_display = ("template", "recipient", "status", "reason", "handled_at")
    list_filter = ("template", "status")
    search_fields = ("recipient",)
    readonly_fields = [f.name for f in NotificationDelivery._meta.fields]
