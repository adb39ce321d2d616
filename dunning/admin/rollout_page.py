"""The rollout page (issue 19 item 1), at /admin/dunning/rolloutstage/: for each policy and cohort
the mode, the percentage and how long it has run in billing cycles; the shadow report's
disagreements; the stages decided so far; and, for billing leads, the promote and rollback forms.

The forms parse input and call ONE service each (dunning.rollout.promotion / .rebinding); a
refusal comes back as a form error and changes nothing. The gates are evaluated on request
("Evaluate the gates") — on a full database they take a while — and always before a promotion.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

from dunning.admin.base import ViewOnlyAdmin
from dunning.models import JobRun, RolloutStage
from dunning.policy.rollout import MODE_ORDER
from dunning.rollout.errors import ROLLOUT_PERMISSION, RolloutError
from dunning.rollout.promotion import rollout_promote
from dunning.rollout.rebinding import REBIND_JOB, rollout_rebind_forward_request, rollout_rollback
from dunning.rollout.shadow_report import shadow_disagreements
from dunning.rollout.status import rollout_status
from dunning.tasks import rebind_cohort_forward


class _Decision(forms.Form):
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), help_text="Why, in a sentence.")
    ticket = forms.CharField(max_length=128, help_text="The ticket or incident reference.")


class PromoteForm(_Decision):
    policy = forms.CharField(max_length=140, help_text="name@version, as published.")
    cohort = forms.CharField(max_length=64, initial="default", help_text='A cohort, or "*" for every cohort.')
    mode = forms.ChoiceField(choices=[(m, m) for m in MODE_ORDER])
    percent = forms.CharField(max_length=8, help_text="0 to 100: the share of low-risk subscriptions enforced.")
    field_order = ["policy", "cohort", "mode", "percent", "reason", "ticket"]


class RollbackForm(_Decision):
    cohort = forms.CharField(max_length=64, initial="default")
    pause_restrictions = forms.BooleanField(required=False, initial=True,
                                            help_text="Also pause new restrictions for the cohort (incident switch).")
    field_order = ["cohort", "pause_restrictions", "reason", "ticket"]


class RebindForm(_Decision):
    cohort = forms.CharField(max_length=64, initial="default", help_text='A cohort, or "*" for every cohort.')
    policy = forms.CharField(max_length=140, help_text="The newer version, name@version: subscriptions on older "
                                                       "versions of that name move to it, for new cycles only.")
    field_order = ["cohort", "policy", "reason", "ticket"]


@admin.register(RolloutStage)
class RolloutAdmin(ViewOnlyAdmin):
    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Every member of the support console reads the rollout; only leads decide (ROLLOUT_PERMISSION).
        return request.user.is_active and request.user.is_staff and request.user.has_module_perms("dunning")

    def get_urls(self):  # noqa: ANN201
        wrap = self.admin_site.admin_view
        return [path("promote/", wrap(self.promote_view), name="dunning_rollout_promote"),
                path("rollback/", wrap(self.rollback_view), name="dunning_rollout_rollback"),
                path("rebind/", wrap(self.rebind_view), name="dunning_rollout_rebind"),
                *super().get_urls()]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        return self._page(request)

    def _page(self, request: HttpRequest, promote: PromoteForm | None = None, rollback: RollbackForm | None = None,
              rebind: RebindForm | None = None, status: int = 200) -> HttpResponse:
        evaluate = request.GET.get("gates") == "1"
        context = {
            **self.admin_site.each_context(request), "opts": self.model._meta, "title": "Rollout",
            "rows": rollout_status(evaluate_gates=evaluate), "gates_evaluated": evaluate,
            "disagreements": shadow_disagreements(limit=200)[:50],
            "stages": RolloutStage.objects.select_related("policy", "started_by")[:30],
            "can_decide": request.user.has_perm(ROLLOUT_PERMISSION),
            "promote_form": promote or PromoteForm(prefix="promote"),
            "rollback_form": rollback or RollbackForm(prefix="rollback"),
            "rebind_form": rebind or RebindForm(prefix="rebind"),
            "promote_url": reverse("admin:dunning_rollout_promote"),
            "rollback_url": reverse("admin:dunning_rollout_rollback"),
            "rebind_url": reverse("admin:dunning_rollout_rebind"),
            "rebind_runs": JobRun.objects.filter(job=REBIND_JOB).order_by("-started_at", "-id")[:10],
        }
        return TemplateResponse(request, "admin/dunning/rollout.html", context, status=status)

    def _decide(self, request: HttpRequest) -> None:
        if request.method != "POST" or not request.user.has_perm(ROLLOUT_PERMISSION):
            raise PermissionDenied("only a billing lead may change a rollout")

    def promote_view(self, request: HttpRequest) -> HttpResponse:
        self._decide(request)
        form = PromoteForm(request.POST, prefix="promote")
        if form.is_valid():
            data = form.cleaned_data
            try:
                stage = rollout_promote(policy=data["policy"], cohort=data["cohort"], to_mode=data["mode"],
                                        percent=data["percent"], by=request.user, reason=data["reason"],
                                        ticket=data["ticket"])
            except RolloutError as exc:
                form.add_error(None, str(exc))
            else:
                messages.success(request, f"{stage.policy.identity} for {stage.cohort!r}: {stage.previous_mode} "
                                          f"{stage.previous_percent} % → {stage.mode} {stage.percent} %")
                return redirect("admin:dunning_rolloutstage_changelist")
        return self._page(request, promote=form, status=400)

    def rollback_view(self, request: HttpRequest) -> HttpResponse:
        self._decide(request)
        form = RollbackForm(request.POST, prefix="rollback")
        if form.is_valid():
            data = form.cleaned_data
            try:
                outcome = rollout_rollback(cohort=data["cohort"], by=request.user, reason=data["reason"],
                                           ticket=data["ticket"], pause_restrictions=data["pause_restrictions"])
            except RolloutError as exc:
                form.add_error(None, str(exc))
            else:
                moved = "; ".join(f"{m.from_policy} → {m.to_policy}: {m.changed} rebound, {len(m.refused)} refused"
                                  for m in outcome.moves)
                paused = " New restrictions paused." if outcome.incident else ""
                messages.success(request, f"Rolled back cohort {data['cohort']!r}: {moved}.{paused}")
                return redirect("admin:dunning_rolloutstage_changelist")
        return self._page(request, rollback=form, status=400)

    def rebind_view(self, request: HttpRequest) -> HttpResponse:
        self._decide(request)
        form = RebindForm(request.POST, prefix="rebind")
        if form.is_valid():
            data = form.cleaned_data
            try:
                target = rollout_rebind_forward_request(
                    cohort=data["cohort"], to_policy=data["policy"], by=request.user, reason=data["reason"],
                    ticket=data["ticket"], enqueue=rebind_cohort_forward.delay)
            except RolloutError as exc:
                form.add_error(None, str(exc))
            else:
                messages.success(request, f"Rebinding cohort {data['cohort'].strip()!r} forward to {target.identity} "
                                          f"is queued; its progress shows under \"Rebind jobs\".")
                return redirect("admin:dunning_rolloutstage_changelist")
        return self._page(request, rebind=form, status=400)
