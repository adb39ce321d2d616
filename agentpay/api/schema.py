"""OpenAPI pieces of the AgentPay API (drf-spectacular), published apart from the billing API
at /agentpay/v1/schema/ (the billing schema at /api/schema/ leaves /agentpay/ out)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers

from agentpay.composite import DISPLAY_STATUSES

PREFIX = "/agentpay/"


class TenantApiKeyScheme(OpenApiAuthenticationExtension):
    target_class = "agentpay.api.auth.TenantApiKeyAuthentication"
    name = "tenantApiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {"type": "http", "scheme": "bearer",
                "description": "A tenant API key from `manage.py agentpay_create_api_key TENANT` (ak_…)."}


class ProblemSerializer(serializers.Serializer):
    """RFC 9457 problem document."""

    type = serializers.URLField()
    title = serializers.CharField()
    status = serializers.IntegerField()
    detail = serializers.CharField(required=False)
    intent_id = serializers.CharField(required=False)
    display_status = serializers.CharField(required=False)


class _SettlementSerializer(serializers.Serializer):
    settlement_id = serializers.CharField()
    rail = serializers.CharField()
    state = serializers.CharField()
    hold_id = serializers.CharField(allow_null=True)


class _FulfillmentSerializer(serializers.Serializer):
    fulfillment_id = serializers.CharField()
    state = serializers.CharField()
    upstream_status_code = serializers.IntegerField(allow_null=True)
    recovery_deadline = serializers.DateTimeField(allow_null=True)


class CompositeViewSerializer(serializers.Serializer):
    intent_id = serializers.CharField()
    idempotency_key = serializers.CharField()
    route = serializers.CharField()
    rail = serializers.CharField()
    amount = serializers.IntegerField()
    currency = serializers.CharField()
    state = serializers.CharField()
    generation = serializers.IntegerField()
    display_status = serializers.ChoiceField(choices=DISPLAY_STATUSES)
    needs_review = serializers.BooleanField()
    settlement = _SettlementSerializer()
    fulfillment = _FulfillmentSerializer()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


COMPOSITE_VIEW = CompositeViewSerializer
PROBLEM = OpenApiResponse(ProblemSerializer, description="Problem document")
# x402 (issue 18): an on-chain settlement not decided when the answer is due. Never a 402.
SETTLEMENT_IN_PROGRESS = OpenApiResponse(
    CompositeViewSerializer, description="On-chain: the settlement is submitted, pending or unknown; PAYMENT-RESPONSE "
                                         "(success false, errorReason settlement_pending, the transaction hash) and "
                                         "Location; replay the same Idempotency-Key, never sign a new payment")
GATEWAY_ERRORS = {
    code: OpenApiResponse(ProblemSerializer, description=text) for code, text in {
        400: "Bad input: missing/oversize/invalid Idempotency-Key, malformed JSON, invalid amount; an unreadable "
             "PAYMENT-SIGNATURE (too large, not base64: the challenge stays open and is sent again)",
        401: "No or invalid API key",
        402: "Wallet: insufficient balance, or no wallet (never a fallback to the chain). On-chain (x402 v2): "
             "payment-required with PAYMENT-REQUIRED (base64 JSON: x402Version 2, resource, accepts[] exact), "
             "payment-invalid with its `reason` (the key is closed), challenge-expired, authorization-expired, "
             "settlement-failed with PAYMENT-RESPONSE errorReason",
        403: "Policy denied (tenant frozen, or its subscription allows no API calls), or the wallet is frozen",
        404: "Unknown route",
        405: "Method not allowed for this route",
        409: "Same Idempotency-Key in flight",
        413: "Body too large",
        422: "Same Idempotency-Key with a different request, or a different PAYMENT-SIGNATURE on a paid key; "
             "amount, currency or rail mismatch",
        503: "On-chain: the route has no active chain network, or the token's nonce state could not be read "
             "(nothing decided; retry the same key)",
        502: "Upstream 5xx: outcome unknown, hold kept (on-chain: paid, PAYMENT-RESPONSE carries the transaction)",
        504: "Upstream timeout or dropped connection: outcome unknown, hold kept",
    }.items()
}


def exclude_agentpay(endpoints: list[tuple]) -> list[tuple]:
    """PREPROCESSING_HOOK of the billing schema: AgentPay publishes its own."""
    return [e for e in endpoints if not e[0].startswith(PREFIX)]


def only_agentpay(endpoints: list[tuple]) -> list[tuple]:
    return [e for e in endpoints if e[0].startswith(PREFIX) and "/schema" not in e[0]]
