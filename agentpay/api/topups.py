"""`POST /agentpay/v1/wallet/topups {"payment_intent": "pi_…"}`: credit the tenant's wallet from a
Stripe payment, fetched from Stripe now (the body names the payment; it is never the evidence).

201 with the credit; 200 with the same credit when the payment was credited before; a problem
document otherwise (400 bad input, 404 no such payment for this tenant, 422 not succeeded or no
wallet in its currency, 503 Stripe did not answer: nothing credited, try again).
"""

from __future__ import annotations

import json
import re

from django.http import JsonResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request

from agentpay.api.problems import problem
from agentpay.api.schema import PROBLEM
from agentpay.api.views import _AgentPayView
from agentpay.bridge import ProviderNoSuchObject, ProviderRefusedRequest, ProviderUnavailable
from agentpay.models import LedgerAccount
from agentpay.services.ledger import LedgerRefusal
from agentpay.services.topups import Topup, wallet_topup_from_provider
from config.json_depth import MAX_JSON_DEPTH, json_nesting_exceeds

_PAYMENT_ID = re.compile(r"^pi_[A-Za-z0-9_]{1,250}$")
# Refusal code → (status, problem slug, title).
REFUSALS = {
    "PAYMENT_NOT_FOR_TENANT": (404, "no-such-payment", "No such payment for this tenant"),
    "PAYMENT_NOT_SUCCEEDED": (422, "payment-not-succeeded", "The payment has not succeeded"),
    "CURRENCY_MISMATCH": (422, "currency-mismatch", "The tenant has no wallet in the payment's currency"),
    "AMOUNT_NOT_POSITIVE": (422, "payment-not-succeeded", "The payment received nothing"),
}


class TopupRequestSerializer(serializers.Serializer):
    payment_intent = serializers.RegexField(_PAYMENT_ID.pattern, help_text="A Stripe PaymentIntent id (pi_…).")


class TopupSerializer(serializers.Serializer):
    transfer_id = serializers.CharField()
    payment_intent = serializers.CharField()
    amount = serializers.IntegerField()
    currency = serializers.CharField()
    wallet = serializers.CharField(help_text="The wallet's account id.")
    available = serializers.IntegerField(help_text="The wallet's available balance now.")
    credited_at = serializers.DateTimeField()
    replayed = serializers.BooleanField()


def _parse(request: Request) -> tuple[str, JsonResponse | None]:
    if json_nesting_exceeds(request.body or b""):
        return "", problem(400, "malformed-request", "The request body is nested too deeply",
                           f"more than {MAX_JSON_DEPTH} levels; send {{\"payment_intent\": \"pi_…\"}}")
    try:
        body = json.loads(request.body or b"")
    except (ValueError, UnicodeDecodeError):
        return "", problem(400, "malformed-request", "The request body is not JSON",
                           'send {"payment_intent": "pi_…"}')
    payment_id = body.get("payment_intent") if isinstance(body, dict) else None
    if not isinstance(payment_id, str) or not _PAYMENT_ID.match(payment_id):
        return "", problem(400, "validation-error", "payment_intent is required",
                           '"payment_intent" must be a Stripe PaymentIntent id (pi_…)')
    return payment_id, None


def _answer(topup: Topup) -> JsonResponse:
    t = topup.transfer
    wallet = LedgerAccount.objects.get(pk=t.credit_account_id)
    return JsonResponse({"transfer_id": t.transfer_id, "payment_intent": t.external_ref, "amount": t.amount,
                         "currency": t.currency, "wallet": wallet.account_id, "available": wallet.available,
                         "credited_at": t.created_at.isoformat(), "replayed": not topup.created},
                        status=201 if topup.created else 200)


class WalletTopupView(_AgentPayView):
    @extend_schema(
        operation_id="agentpay_wallet_topup", summary="Top up the wallet from a Stripe payment",
        description="Fetches the PaymentIntent from Stripe and credits `amount_received` once: it must have "
                    "succeeded and name this tenant (`metadata.agentpay_tenant`, or paid by the tenant's linked "
                    "customer). A repeat answers 200 with the same transfer.",
        request=TopupRequestSerializer,
        responses={201: TopupSerializer, 200: OpenApiResponse(TopupSerializer, description="Already credited"),
                   400: PROBLEM, 401: PROBLEM, 404: PROBLEM, 422: PROBLEM, 502: PROBLEM, 503: PROBLEM})
    def post(self, request: Request) -> JsonResponse:
        payment_id, refused = _parse(request)
        if refused is not None:
            return refused
        try:
            topup = wallet_topup_from_provider(tenant=request.user.tenant, payment_id=payment_id)
        except ProviderUnavailable as exc:
            return problem(503, "provider-unavailable", "Stripe did not answer",
                           f"{exc}; nothing was credited, retry later", headers={"Retry-After": "30"})
        except ProviderNoSuchObject:
            return refusal_problem("PAYMENT_NOT_FOR_TENANT", f"no payment {payment_id} for this tenant")
        except ProviderRefusedRequest as exc:
            return problem(502, "provider-refused", "Stripe refused the lookup", str(exc)[:300])
        except LedgerRefusal as refusal:
            return refusal_problem(refusal.code, refusal.detail)
        return _answer(topup)


def refusal_problem(code: str, detail: str) -> JsonResponse:
    status, slug, title = REFUSALS.get(code, (422, "refused", "The top-up was refused"))
    return problem(status, slug, title, detail, code=code)
