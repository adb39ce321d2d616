"""Read endpoints (SPEC §13): entitlement (for runtime services), subscription, cycle, transitions,
policies. They only read; every write is in views_write."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.generics import ListAPIView
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from dunning.actions.provider_cancel import cancellation_state
from dunning.models import TransitionReceipt
from dunning.reads.review import subscription_verdict
from entitlements.api.auth import CanReadBilling, CanReadEntitlements
from entitlements.api.problems import problem_responses
from entitlements.api.selectors import (
    cycle_for_request,
    subscription_blocking_cycles,
    subscription_current_snapshot,
    subscription_for_request,
)
from entitlements.api.serializers import (
    CycleSerializer,
    EntitlementSerializer,
    SubscriptionSerializer,
    TransitionSerializer,
)
from entitlements.profiles import get_profile
from subscriptions.models import Subscription
from subscriptions.providers.labels import provider_label, provider_summary

# Entitlements change the moment a cycle restricts or recovers, so no cache may answer from its
# own copy: `max-age=0, must-revalidate` makes every holder ask again, and the ETag makes asking
# cheap (304, no body). `private`: the answer is one tenant's, fetched with credentials.
ENTITLEMENT_CACHE_CONTROL = "private, max-age=0, must-revalidate"

SUBSCRIPTION_REF = OpenApiParameter("ref", OpenApiTypes.STR, OpenApiParameter.PATH,
                                    description="Local subscription id or the provider's id (sub_…).")
CYCLE_REF = OpenApiParameter("ref", OpenApiTypes.STR, OpenApiParameter.PATH,
                             description="The cycle's uuid (cycle_id) or its local id.")
IF_NONE_MATCH = OpenApiParameter("If-None-Match", OpenApiTypes.STR, OpenApiParameter.HEADER, required=False,
                                 description="An ETag from an earlier answer; 304 while the generation is the same.")


def entitlement_etag(subscription: Subscription) -> str:
    """Strong validator: one per (subscription, generation); a generation is never re-issued."""
    return f'"sub-{subscription.pk}-g{subscription.entitlement_generation}"'


def etag_matches(header: str, etag: str) -> bool:
    """If-None-Match uses the weak comparison (RFC 9110 §13.1.2)."""
    if header.strip() == "*":
        return True
    tags = [t.strip().removeprefix("W/") for t in header.split(",")]
    return etag in tags


def entitlement_body(subscription: Subscription) -> dict[str, Any]:
    snapshot = subscription_current_snapshot(subscription)
    provider = provider_summary(subscription.provider, subscription.provider_account)
    if snapshot is not None:
        return {"subscription": subscription.pk, "provider_subscription_id": subscription.provider_subscription_id,
                "provider": provider, "generation": snapshot.generation, "profile": snapshot.profile,
                "capabilities": snapshot.capabilities, "reason": snapshot.reason, "issued_at": snapshot.issued_at}
    profile = get_profile(subscription.entitlement_profile)  # no snapshot yet: state what the row holds
    return {"subscription": subscription.pk, "provider_subscription_id": subscription.provider_subscription_id,
            "provider": provider, "generation": subscription.entitlement_generation, "profile": profile.name,
            "capabilities": profile.capabilities(), "reason": "no snapshot issued yet",
            "issued_at": subscription.created_at}


class SubscriptionEntitlementView(APIView):
    permission_classes = [CanReadEntitlements]
    throttle_scope = "entitlement_read"

    @extend_schema(
        operation_id="subscription_entitlement", parameters=[SUBSCRIPTION_REF, IF_NONE_MATCH], tags=["entitlements"],
        summary="The current entitlement of a subscription (ETag from the generation)",
        responses={200: EntitlementSerializer,
                   304: OpenApiResponse(description="Not modified: the generation is the one you hold."),
                   **problem_responses()},
    )
    def get(self, request: Request, ref: str) -> Response:
        subscription = subscription_for_request(request, ref)
        etag = entitlement_etag(subscription)
        headers = {"ETag": etag, "Cache-Control": ENTITLEMENT_CACHE_CONTROL, "Vary": "Authorization, Cookie"}
        if etag_matches(request.headers.get("If-None-Match", ""), etag):
            return Response(status=304, headers=headers)
        data = EntitlementSerializer(entitlement_body(subscription)).data
        return Response(data, headers=headers)


class SubscriptionDetailView(APIView):
    permission_classes = [CanReadBilling]
    throttle_scope = "billing_read"

    @extend_schema(operation_id="subscription_detail", parameters=[SUBSCRIPTION_REF], tags=["billing"],
                   summary="Root, current profile and generation, blocking cycles, review verdict",
                   responses={200: SubscriptionSerializer, **problem_responses()})
    def get(self, request: Request, ref: str) -> Response:
        subscription = subscription_for_request(request, ref)
        data = {
            "id": subscription.pk, "provider": subscription.provider,
            "provider_label": provider_label(subscription.provider),
            "provider_account": subscription.provider_account,
            "provider_subscription_id": subscription.provider_subscription_id,
            "provider_status": subscription.provider_status, "cohort": subscription.cohort,
            "policy": subscription.policy.identity, "outstanding_cycle_root": subscription.outstanding_cycle_root,
            "entitlement_profile": subscription.entitlement_profile,
            "entitlement_generation": subscription.entitlement_generation,
            "blocking_cycles": subscription_blocking_cycles(subscription),
            "verdict": subscription_verdict(subscription).as_dict(),
            "contract": {
                "status": subscription.provider_status, "phase": subscription.contract_phase,
                "price_id": subscription.price_id, "billing_interval": subscription.billing_interval,
                "cancel_at_period_end": subscription.cancel_at_period_end,
                "current_period_end": subscription.current_period_end, "ended_at": subscription.contract_ended_at,
                "paused": subscription.pause_behavior, "pause_resumes_at": subscription.pause_resumes_at,
                "trial_end": subscription.trial_end, "revision": subscription.contract_revision,
                "provider_cancellation": cancellation_state(subscription) or None,
            },
        }
        return Response(SubscriptionSerializer(data).data)


class CycleDetailView(APIView):
    permission_classes = [CanReadBilling]
    throttle_scope = "billing_read"

    @extend_schema(operation_id="cycle_detail", parameters=[CYCLE_REF], tags=["billing"],
                   responses={200: CycleSerializer, **problem_responses()})
    def get(self, request: Request, ref: str) -> Response:
        return Response(CycleSerializer(cycle_for_request(request, ref)).data)


class CycleTransitionsView(ListAPIView):
    """Every transition receipt of the cycle, accepted and rejected, newest first."""

    permission_classes = [CanReadBilling]
    throttle_scope = "billing_read"
    serializer_class = TransitionSerializer

    def get_queryset(self) -> QuerySet:
        cycle = cycle_for_request(self.request, self.kwargs["ref"])
        return TransitionReceipt.objects.filter(cycle=cycle).select_related("cycle")

    @extend_schema(operation_id="cycle_transitions", parameters=[CYCLE_REF], tags=["billing"],
                   responses={200: TransitionSerializer(many=True), **problem_responses()})
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)
