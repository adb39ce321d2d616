"""State-changing endpoints (SPEC §13): each parses input, loads by id, claims the
Idempotency-Key and calls ONE service, then renders its typed result. Never saves a model."""

from __future__ import annotations

from typing import Any

from django.db.models import Q, QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.generics import ListAPIView
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import Serializer
from rest_framework.views import APIView

from dunning.clock import trusted_now
from dunning.models import DunningPolicy
from dunning.policy_document import PolicyValidationError
from dunning.services.acceptance import cycle_accept_transition
from dunning.services.policies import PolicyConflict, policy_publish
from dunning.services.results import Cause, Expect, TransitionResult
from dunning.services.retry_now import cycle_retry_now
from entitlements.api.auth import CanGrantException, CanPublishPolicy, CanReadBilling, CanRetryPayment, ServicePrincipal
from entitlements.api.idempotency import idempotent_call
from entitlements.api.problems import problem_response, problem_responses
from entitlements.api.selectors import cycle_for_request
from entitlements.api.serializers import (
    ExceptionGrantSerializer,
    PolicyPublishResultSerializer,
    PolicyPublishSerializer,
    PolicySerializer,
    RetryRequestSerializer,
    RetryResultSerializer,
    TransitionResultSerializer,
)
from entitlements.api.views_read import CYCLE_REF

IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key", OpenApiTypes.STR, OpenApiParameter.HEADER, required=True,
    description="Unique per request (1-255 visible ASCII). A repeat with the same body replays the stored "
                "response (header Idempotent-Replayed: true) for 24 h; a different body → 422; while the first "
                "is running → 409.",
)
WRITE_ERRORS = problem_responses(409, 415, 422)

# Refusals that say the input cannot be accepted as given (422); other refusals are state conflicts (409).
UNPROCESSABLE_REFUSALS = frozenset({
    "EXCEPTION_EXPIRY_NOT_IN_FUTURE", "EXCEPTION_TOO_LONG", "UNKNOWN_PROFILE", "REASON_AND_TICKET_REQUIRED",
    "MANUAL_DECISION_REQUIRED",
})


def _valid(serializer_class: type[Serializer], request: Request) -> dict[str, Any]:
    serializer = serializer_class(data=request.data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def refusal_response(code: str, detail: str, *, unprocessable: bool = False) -> Response:
    status = 422 if unprocessable else 409
    slug = code.lower().replace("_", "-") or "refused"
    return problem_response(status, slug, "Refused", detail or code, code=code)


def transition_response(result: TransitionResult) -> Response:
    if not result.accepted:
        return refusal_response(result.reason, result.detail, unprocessable=result.reason in UNPROCESSABLE_REFUSALS)
    return Response(TransitionResultSerializer(result).data)


class CycleExceptionView(APIView):
    permission_classes = [CanGrantException]
    throttle_scope = "billing_write"

    @extend_schema(
        operation_id="cycle_exception_grant", parameters=[CYCLE_REF, IDEMPOTENCY_KEY], tags=["billing"],
        request=ExceptionGrantSerializer, summary="Grant an expiring exception (through the acceptance service)",
        responses={200: TransitionResultSerializer, **WRITE_ERRORS},
    )
    def post(self, request: Request, ref: str) -> Response:
        cycle = cycle_for_request(request, ref)
        data = _valid(ExceptionGrantSerializer, request)
        params: dict[str, Any] = {"expires_at": data["expires_at"]}
        params.update({k: data[k] for k in ("owner", "profile") if k in data})
        cause = Cause.staff(request.user, reason=data["reason"], ticket=data["ticket"])
        return idempotent_call(request, lambda: transition_response(cycle_accept_transition(
            cycle_pk=cycle.pk, edge="grant_exception", expect=Expect.from_cycle(cycle), cause=cause,
            params=params, now=trusted_now())))


class CycleRetryView(APIView):
    permission_classes = [CanRetryPayment]
    throttle_scope = "billing_write"

    @extend_schema(
        operation_id="cycle_retry_now", parameters=[CYCLE_REF, IDEMPOTENCY_KEY], tags=["billing"],
        request=RetryRequestSerializer, summary="Retry the payment now (refused in plain words when unsafe)",
        responses={200: RetryResultSerializer,
                   202: OpenApiResponse(RetryResultSerializer, description="Outcome UNKNOWN: being reconciled"),
                   **WRITE_ERRORS},
    )
    def post(self, request: Request, ref: str) -> Response:
        cycle = cycle_for_request(request, ref)
        data = _valid(RetryRequestSerializer, request)
        cause = Cause.staff(request.user, reason=data["reason"], ticket=data["ticket"])

        def run() -> Response:
            outcome = cycle_retry_now(cycle_pk=cycle.pk, cause=cause, now=trusted_now())
            if outcome.status == "REFUSED":
                return refusal_response(outcome.code, outcome.detail)
            body = RetryResultSerializer({"status": outcome.status, "detail": outcome.detail,
                                          "code": outcome.code}).data
            return Response(body, status=202 if outcome.status == "UNKNOWN" else 200)

        return idempotent_call(request, run)


class PolicyListView(ListAPIView):
    """GET lists published policies (newest first); POST publishes one (billing leads)."""

    serializer_class = PolicySerializer

    def get_permissions(self) -> list[Any]:
        return [CanPublishPolicy()] if self.request.method == "POST" else [CanReadBilling()]

    def get_throttles(self) -> list[Any]:
        self.throttle_scope = "billing_write" if self.request.method == "POST" else "billing_read"
        return super().get_throttles()

    def get_queryset(self) -> QuerySet:
        queryset = DunningPolicy.objects.all()
        user = self.request.user
        if isinstance(user, ServicePrincipal) and user.token.cohort:
            queryset = queryset.filter(Q(cohort=user.token.cohort) | Q(cohort="*"))
        return queryset

    @extend_schema(operation_id="policy_list", tags=["policies"],
                   responses={200: PolicySerializer(many=True), **problem_responses()})
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    @extend_schema(
        operation_id="policy_publish", parameters=[IDEMPOTENCY_KEY], tags=["policies"],
        request=PolicyPublishSerializer, summary="Publish a policy document (YAML or JSON text)",
        responses={201: PolicyPublishResultSerializer,
                   200: OpenApiResponse(PolicyPublishResultSerializer, description="Already published, identical"),
                   **WRITE_ERRORS},
    )
    def post(self, request: Request) -> Response:
        text = _valid(PolicyPublishSerializer, request)["text"]
        user = request.user

        def run() -> Response:
            try:
                policy, created = policy_publish(text=text, user=user)
            except PolicyValidationError as exc:
                return problem_response(422, "policy-invalid", "The policy document is not valid",
                                        "; ".join(exc.errors),
                                        errors=[{"field": "text", "message": e, "code": "invalid"} for e in exc.errors])
            except PolicyConflict as exc:
                return problem_response(409, "policy-conflict", "Policy identity already published", str(exc))
            body = PolicyPublishResultSerializer({"created": created, "policy": policy}).data
            return Response(body, status=201 if created else 200)

        return idempotent_call(request, run)

