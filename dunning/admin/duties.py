"""Admin pages of seed 003's duties: the compensation queue, the weekly sample review and its
trend page. Each view parses a form, calls ONE service (`dunning.actions.compensation`,
`dunning.actions.sample_review`) and says what happened; none saves a row itself. A decision
the user may not take is not offered, and is refused by the service if posted anyway.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from dunning.actions import compensation as comp
from dunning.actions import sample_review as sampling
from dunning.admin.base import ViewOnlyAdmin
from dunning.admin.timeline import subscription_timeline
from dunning.clock import trusted_now
from dunning.models.duties import (
    CompensationCase,
    CompensationResolution,
    CompensationState,
    ReviewerVerdict,
    SampleReview,
    SampleReviewItem,
    SampleVerdict,
)
from dunning.reads.review import subscription_verdict
from dunning.reads.sample_trend import trend_figures, trend_svg

EVIDENCE_SHOWN = 40


def _age(since: datetime) -> str:
    seconds = int((trusted_now() - since).total_seconds())
    days, rest = divmod(max(seconds, 0), 86400)
    return f"{days} d {rest // 3600} h" if days else f"{rest // 3600} h {rest % 3600 // 60} min"


def _subscription_link(sub: Any) -> str:
    url = reverse("admin:subscriptions_subscription_change", args=[sub.pk])
    return format_html('<a class="subscription-link" href="{}">{}</a>', url, sub.provider_subscription_id)


class ResolveCaseForm(forms.Form):
    resolution = forms.ChoiceField(choices=CompensationResolution.choices, widget=forms.RadioSelect)
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 60}), help_text="Why: kept on the case.")
    ticket = forms.CharField(max_length=128, help_text="Ticket reference, e.g. SUP-1234.")
    exception_expires_at = forms.DateTimeField(
        required=False, label="Exception ends (UTC)", help_text="Only for “restore access for a bounded time”: "
                                                               "YYYY-MM-DD HH:MM, within the policy's maximum.")

    def clean_exception_expires_at(self) -> datetime | None:
        value = self.cleaned_data.get("exception_expires_at")
        return value if value is None or timezone.is_aware(value) else timezone.make_aware(value, timezone.utc)


@admin.register(CompensationCase)
class CompensationCaseAdmin(ViewOnlyAdmin):
    list_display = ("case_label", "kind_label", "state_and_owner", "age", "subscription_link", "source_link")
    list_filter = ("state", "kind")
    search_fields = ("subscription__provider_subscription_id", "invoice__provider_invoice_id", "ticket")
    list_select_related = ("subscription", "owner", "source_alert", "source_report")
    ordering = ("state", "opened_at", "pk")
    change_form_template = "admin/dunning/compensationcase/change_form.html"
    fields = ("kind", "detail", "opened_at", "state", "resolution", "reason", "ticket", "resolved_at")
    readonly_fields = fields

    @admin.display(description="case", ordering="pk")
    def case_label(self, case: CompensationCase) -> str:
        return f"#{case.pk}"

    @admin.display(description="kind", ordering="kind")
    def kind_label(self, case: CompensationCase) -> str:
        return case.get_kind_display()

    @admin.display(description="state / owner", ordering="state")
    def state_and_owner(self, case: CompensationCase) -> str:
        if case.state == CompensationState.RESOLVED:
            return format_html('<span style="color:#1b7f3b">resolved</span> — {}', case.get_resolution_display())
        if case.owner_id:
            return format_html("<strong>owned</strong> — {}", case.owner.get_username())
        return format_html('<strong style="color:#b00020">{}</strong>', "open — nobody owns it")

    @admin.display(description="age", ordering="opened_at")
    def age(self, case: CompensationCase) -> str:
        return _age(case.opened_at) if case.resolved_at is None else f"took {_age(case.opened_at)}"

    @admin.display(description="subscription")
    def subscription_link(self, case: CompensationCase) -> str:
        return _subscription_link(case.subscription)

    @admin.display(description="found by")
    def source_link(self, case: CompensationCase) -> str:
        if case.source_alert_id:
            url = reverse("admin:dunning_alert_change", args=[case.source_alert_id])
            return format_html('<a class="source-link" href="{}">alert {}</a>', url, case.source_alert.dedupe_key)
        if case.source_report_id:
            url = reverse("admin:dunning_reconciliationreport_change", args=[case.source_report_id])
            finding = case.source_finding.get("kind", "")
            return format_html('<a class="source-link" href="{}">reconciliation {} ({})</a>', url,
                               case.source_report_id, finding)
        return "—"

    def get_urls(self):  # noqa: ANN201
        wrap = self.admin_site.admin_view
        return [path("<int:object_id>/take/", wrap(self.take_view), name="dunning_compensationcase_take"),
                path("<int:object_id>/resolve/", wrap(self.resolve_view), name="dunning_compensationcase_resolve"),
                *super().get_urls()]

    def change_view(self, request, object_id, form_url="", extra_context=None):  # noqa: ANN001, ANN201
        extra_context = dict(extra_context or {})
        case = (CompensationCase.objects.select_related("subscription__customer", "invoice", "cycle", "owner")
                .filter(pk=object_id).first() if str(object_id).isdigit() else None)
        if case is not None:
            lead = request.user.has_perm(comp.PERMISSION)
            open_case = case.state != CompensationState.RESOLVED
            extra_context.update(
                case=case, case_age=_age(case.opened_at), source_link=self.source_link(case),
                subscription_link=_subscription_link(case.subscription),
                trail=list(case.actions.order_by("at", "pk")),
                evidence=subscription_timeline(case.subscription, limit=EVIDENCE_SHOWN),
                verdict=subscription_verdict(case.subscription),
                can_take=open_case and lead and case.owner_id != request.user.pk,
                can_resolve=open_case and lead and case.owner_id == request.user.pk,
                resolve_form=ResolveCaseForm(),
                take_url=reverse("admin:dunning_compensationcase_take", args=[case.pk]),
                resolve_url=reverse("admin:dunning_compensationcase_resolve", args=[case.pk]))
        return super().change_view(request, object_id, form_url, extra_context)

    def take_view(self, request: HttpRequest, object_id: int) -> HttpResponse:
        get_object_or_404(CompensationCase.objects.only("pk"), pk=object_id)  # an unknown case is a 404, as resolve's
        back = reverse("admin:dunning_compensationcase_change", args=[object_id])
        if request.method != "POST":
            return redirect(back)
        try:
            decision = comp.compensation_take(case_pk=object_id, user=request.user)
        except comp.CompensationRefused as refused:
            self.message_user(request, f"Refused ({refused.code}): {refused.detail}", messages.ERROR)
        else:
            self.message_user(request, decision.text, messages.SUCCESS)
        return redirect(back)

    def resolve_view(self, request: HttpRequest, object_id: int) -> HttpResponse:
        case = get_object_or_404(CompensationCase.objects.select_related("subscription"), pk=object_id)
        back = reverse("admin:dunning_compensationcase_change", args=[case.pk])
        form = ResolveCaseForm(request.POST if request.method == "POST" else None)
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                decision = comp.compensation_resolve(
                    case_pk=case.pk, user=request.user, resolution=data["resolution"], reason=data["reason"],
                    ticket=data["ticket"], exception_expires_at=data["exception_expires_at"])
            except comp.CompensationRefused as refused:
                form.add_error(None, f"Refused ({refused.code}): {refused.detail}")
            else:
                self.message_user(request, decision.text, messages.SUCCESS)
                return redirect(back)
        context = {**self.admin_site.each_context(request), "title": f"Resolve compensation case #{case.pk}",
                   "opts": self.model._meta, "object": case, "form": form, "back_url": back,
                   "changelist_url": reverse("admin:dunning_compensationcase_changelist"),
                   "summary": [("Case", case.get_kind_display()), ("Subscription", case.subscription),
                               ("What was found", case.detail)],
                   "action": {"label": "Resolve", "explain": "Each resolution but “explained” goes through the "
                              "acceptance services, which may refuse; the case is resolved only if they accept."}}
        return TemplateResponse(request, "admin/dunning/operations_action.html", context)


# --------------------------------------------------------------------------- weekly sample review


class VerdictForm(forms.Form):
    verdict = forms.ChoiceField(choices=ReviewerVerdict.choices, widget=forms.RadioSelect)
    note = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
                           help_text="Required for INCORRECT and UNSURE: what you saw.")


@admin.register(SampleReview)
class SampleReviewAdmin(ViewOnlyAdmin):
    list_display = ("week", "picked_at", "population", "picked", "trend_link")
    ordering = ("-week",)
    change_form_template = "admin/dunning/samplereview/change_form.html"
    change_list_template = "admin/dunning/samplereview/change_list.html"
    fields = ("week", "week_start", "week_end", "picked_at", "requested_size", "population", "seed")
    readonly_fields = fields

    @admin.display(description="picked")
    def picked(self, review: SampleReview) -> int:
        return review.items.count()

    @admin.display(description="")
    def trend_link(self, review: SampleReview) -> str:
        return format_html('<a href="{}">trend</a>', reverse("admin:dunning_samplereview_trend"))

    def get_urls(self):  # noqa: ANN201
        return [path("trend/", self.admin_site.admin_view(self.trend_view), name="dunning_samplereview_trend"),
                *super().get_urls()]

    def change_view(self, request, object_id, form_url="", extra_context=None):  # noqa: ANN001, ANN201
        extra_context = dict(extra_context or {})
        review = SampleReview.objects.filter(pk=object_id).first() if str(object_id).isdigit() else None
        if review is not None:
            items = list(review.items.select_related("subscription").order_by("position"))
            current = {v.item_id: v for v in SampleVerdict.objects.filter(item__review=review,
                                                                          replaced_by__isnull=True)}
            extra_context.update(review=review, rows=[(item, current.get(item.pk)) for item in items])
        return super().change_view(request, object_id, form_url, extra_context)

    def trend_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied("you may not view the sample reviews")
        weeks = trend_figures()
        context = {**self.admin_site.each_context(request), "title": "Weekly sample review: trend",
                   "opts": self.model._meta, "weeks": weeks, "chart": mark_safe(trend_svg(weeks))}  # noqa: S308
        return TemplateResponse(request, "admin/dunning/samplereview/trend.html", context)


@admin.register(SampleReviewItem)
class SampleReviewItemAdmin(ViewOnlyAdmin):
    list_display = ("__str__", "automatic_verdict")
    list_filter = ("review__week", "automatic_verdict")
    change_form_template = "admin/dunning/samplereviewitem/change_form.html"
    fields = ("review", "subscription", "position", "automatic_verdict")
    readonly_fields = fields

    def get_urls(self):  # noqa: ANN201
        return [path("<int:object_id>/verdict/", self.admin_site.admin_view(self.verdict_view),
                     name="dunning_samplereviewitem_verdict"), *super().get_urls()]

    def change_view(self, request, object_id, form_url="", extra_context=None):  # noqa: ANN001, ANN201
        extra_context = dict(extra_context or {})
        item = (SampleReviewItem.objects.select_related("review", "subscription").filter(pk=object_id).first()
                if str(object_id).isdigit() else None)
        if item is not None:
            extra_context.update(
                item=item, subscription_link=_subscription_link(item.subscription),
                current=sampling.current_verdict(item),
                history=list(item.verdicts.select_related("reviewer").order_by("-recorded_at", "-pk")),
                can_review=request.user.has_perm(sampling.PERMISSION), verdict_form=VerdictForm(),
                verdict_url=reverse("admin:dunning_samplereviewitem_verdict", args=[item.pk]),
                review_url=reverse("admin:dunning_samplereview_change", args=[item.review_id]))
        return super().change_view(request, object_id, form_url, extra_context)

    def verdict_view(self, request: HttpRequest, object_id: int) -> HttpResponse:
        item = get_object_or_404(SampleReviewItem, pk=object_id)
        back = reverse("admin:dunning_samplereviewitem_change", args=[item.pk])
        form = VerdictForm(request.POST if request.method == "POST" else None)
        if request.method == "POST" and form.is_valid():
            try:
                recorded = sampling.sample_verdict_record(item_pk=item.pk, user=request.user,
                                                          verdict=form.cleaned_data["verdict"],
                                                          note=form.cleaned_data["note"])
            except sampling.SampleReviewRefused as refused:
                form.add_error(None, f"Refused ({refused.code}): {refused.detail}")
            else:
                self.message_user(request, f"Recorded: {recorded.get_verdict_display()}.", messages.SUCCESS)
                return redirect(back)
        context = {**self.admin_site.each_context(request), "title": f"Verdict on {item}",
                   "opts": self.model._meta, "object": item, "form": form, "back_url": back,
                   "changelist_url": reverse("admin:dunning_samplereviewitem_changelist"),
                   "summary": [("Automatic verdict", item.automatic_verdict)],
                   "action": {"label": "Record verdict", "explain": "Your verdict on whether the state agrees "
                              "with the evidence. A change is recorded as a new verdict; the old one stays."}}
        return TemplateResponse(request, "admin/dunning/operations_action.html", context)
