"""The refund queue in the admin (issue 18 item 4): open refund obligations, and a billing
lead's "Pay back on chain" (reason + ticket; one service call, `refund_pay`). Registered from
agentpay.admin. The page saves nothing itself."""

from __future__ import annotations

from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.urls import path, reverse

from agentpay.admin_base import ReadOnlyAdmin
from agentpay.admin_review import ReasonTicketForm, ReviewAction, _page, _require
from agentpay.chain.rpc import ChainRejected, ChainTimeout
from agentpay.models import ChainTransaction, RefundObligation
from agentpay.services.acceptance import REVIEW_PERMISSION
from agentpay.services.refunds import refund_pay
from agentpay.services.results import Refusal

PAY_REFUND = ReviewAction(
    "Pay back on chain", REVIEW_PERMISSION,
    "Sends the amount back to the payer from the pay-to account, on chain, once (the signed transaction is kept "
    "before it is sent). When it is confirmed, the intent is closed as not delivered, with your reason and ticket.")


def refund_pay_view(model_admin: admin.ModelAdmin, request: HttpRequest, object_id: str) -> HttpResponse:
    _require(request, PAY_REFUND)
    refund = get_object_or_404(RefundObligation.objects.select_related("intent", "owner"), pk=object_id)
    back = reverse("admin:agentpay_refundobligation_change", args=[refund.pk])
    form = ReasonTicketForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        try:
            result = refund_pay(refund.refund_id, user=request.user, reason=form.cleaned_data["reason"],
                                ticket=form.cleaned_data["ticket"])
        except Refusal as refusal:
            form.add_error(None, f"Refused ({refusal.code}): {refusal.detail}")
        except (ChainTimeout, ChainRejected) as exc:
            form.add_error(None, f"The chain did not answer; nothing was signed or sent ({exc}). Try again.")
        else:
            if result.accepted:
                messages.success(request, f"Refund {refund.refund_id} is {result.state}.")
                return redirect(back)
            form.add_error(None, f"Refused ({result.refusal_code}): {result.detail}")
    summary = [("Refund", refund.refund_id), ("Intent", refund.intent.intent_id), ("Payer", refund.payer),
               ("Amount (atomic units)", refund.amount), ("State", refund.state),
               ("Owner", refund.owner.get_username() if refund.owner_id else "nobody yet")]
    return _page(request, model_admin, obj=refund, action=PAY_REFUND, form=form, summary=summary, back_url=back)


class RefundObligationAdmin(ReadOnlyAdmin):
    list_display = ("refund_id", "intent", "payer", "amount", "state", "owner", "created_at", "tx_hash")
    list_filter = ("state",)
    search_fields = ("refund_id", "intent__intent_id", "payer")
    readonly_fields = [f.name for f in RefundObligation._meta.fields]

    @admin.display(description="transaction")
    def tx_hash(self, refund: RefundObligation) -> str:
        tx = ChainTransaction.objects.filter(refund=refund).only("tx_hash").first()
        return tx.tx_hash if tx else "—"

    change_form_template = "admin/agentpay/refundobligation/change_form.html"

    def get_urls(self):  # noqa: ANN201
        view = self.admin_site.admin_view(lambda request, object_id: refund_pay_view(self, request, object_id))
        return [path("<int:object_id>/pay/", view, name="agentpay_refundobligation_pay"), *super().get_urls()]

    def change_view(self, request, object_id, form_url="", extra_context=None):  # noqa: ANN001, ANN201
        extra = dict(extra_context or {})
        refund = RefundObligation.objects.filter(pk=object_id).first() if str(object_id).isdigit() else None
        if refund is not None and refund.state == "not_started" and request.user.has_perm(REVIEW_PERMISSION):
            extra.update(pay_action=PAY_REFUND,
                         pay_url=reverse("admin:agentpay_refundobligation_pay", args=[refund.pk]))
        return super().change_view(request, object_id, form_url, extra)


admin.site.register(RefundObligation, RefundObligationAdmin)
