"""State-changing endpoints (SPEC §13): each parses input, loads by id, claims the
Idempotency-Key and calls ONE service, then renders its typed result. Never saves a model.

Operations (issue 15): re-processing a held provider event (billing leads), acknowledging and
resolving alerts (support agents, billing leads), and the alert list those actions start from."""

from __future__ import annotations

import re
from typing import Any

from django.db.models import Prefetch, Q, QuerySet
from django.http import Http404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import exceptions
from rest_framework.generics import ListAPIView
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import Serializer
from rest_framework.views import APIView

from dunning.acceptance.inputs import Cause, TransitionResult
from dunning.actions.alerts import AlertRefused, alert_acknowledge, alert_resolve_by_staff
from dunning.actions.retry_now import cycle_retry_now
from dunning.actions.support import cycle_grant_exception
from dunning.clock import trusted_now
from dunning.evidence.reprocessing import HELD_OUTCOMES, ReprocessOutcome, ReprocessRefused, event_reprocess
from dunning.models import Alert, AlertKind, DunningPolicy, ProviderEvent
from dunning.models.operations import AlertAction
from dunning.policy.document import PolicyValidationError
from dunning.policy.publishing import PolicyConflict, policy_publish
from entitlements.api.auth import (
    CanGrantException,
    CanPublishPolicy,
    CanReadBilling,
    CanRetryPayment,
    ServicePrincipal,
    _Rule,
)
from entitlements.api.idempotency import idempotent_call
from entitlements.api.problems import PROBLEM_CONTENT_TYPE, ProblemSerializer, problem_response, problem_responses
from entitlements.api.selectors import cycle_for_request
from entitlements.api.serializers import (
    AlertAcknowledgeSerializer,
    AlertResolveSerializer,
    AlertSerializer,
    EventReprocessRequestSerializer,
    EventReprocessResultSerializer,
    ExceptionGrantSerializer,
    PolicyPublishResultSerializer,
    PolicyPublishSerializer,
    PolicySerializer,
    RetryRequestSerializer,
    RetryResultSerializer,
    TransitionResultSerializer,
)
from entitlements.api.views_read import CYCLE_REF
from subscriptions.providers.labels import KNOWN_PROVIDERS

IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key", OpenApiTypes.STR, OpenApiParameter.HEADER, required=True,
    description="Unique per request (1-255 visible ASCII). A repeat with the same body replays the stored "
                "response (header Idempotent-Replayed: true) for 24 h; a different body → 422; while the first "
                "is running → 409.",
)
WRITE_ERRORS = problem_responses(409, 415, 422)


def write_schema(operation_id: str, *, path: tuple[OpenApiParameter, ...] = (), tag: str,
                 request: type[Serializer], summary: str, responses: dict[Any, Any],
                 description: str | None = None, more_responses: dict[Any, Any] | None = None) -> Any:
    """The schema of a state-changing endpoint: its path parameters and the Idempotency-Key header, its own
    responses, then the refusals every write may answer (WRITE_ERRORS) and any `more_responses`."""
    return extend_schema(operation_id=operation_id, parameters=[*path, IDEMPOTENCY_KEY], tags=[tag], request=request,
                         summary=summary, description=description,
                         responses={**responses, **WRITE_ERRORS, **(more_responses or {})})


# A state-changing endpoint, throttled with the other billing writes. (No docstring: drf-spectacular
# would inherit it as the description of every write view that has none of its own.)
class WriteView(APIView):
    throttle_scope = "billing_write"

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
    return problem_response(status, code or "refused", "Refused", detail or code, code=code)


def transition_response(result: TransitionResult) -> Response:
    if not result.accepted:
        return refusal_response(result.reason, result.detail, unprocessable=result.reason in UNPROCESSABLE_REFUSALS)
    return Response(TransitionResultSerializer(result).data)


class CycleExceptionView(WriteView):
    permission_classes = [CanGrantException]

    @write_schema(
        "cycle_exception_grant", path=(CYCLE_REF,), tag="billing", request=ExceptionGrantSerializer,
        summary="Grant an expiring exception (through the acceptance service)",
        responses={200: TransitionResultSerializer},
    )
    def post(self, request: Request, ref: str) -> Response:
        cycle = cycle_for_request(request, ref)
        data = _valid(ExceptionGrantSerializer, request)
        # The support console's service: one path for this staff decision, whoever asks.
        return idempotent_call(request, lambda: transition_response(cycle_grant_exception(
            cycle_pk=cycle.pk, user=request.user, expires_at=data["expires_at"], owner=data.get("owner", ""),
            profile=data.get("profile"), reason=data["reason"], ticket=data["ticket"], now=trusted_now())))


class CycleRetryView(WriteView):
    permission_classes = [CanRetryPayment]

    @write_schema(
        "cycle_retry_now", path=(CYCLE_REF,), tag="billing", request=RetryRequestSerializer,
        summary="Retry the payment now (refused in plain words when unsafe)",
        responses={200: RetryResultSerializer,
                   202: OpenApiResponse(RetryResultSerializer, description="Outcome UNKNOWN: being reconciled")},
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


PROVIDER_FILTER = OpenApiParameter("provider", OpenApiTypes.STR, OpenApiParameter.QUERY, required=False,
                                   enum=list(KNOWN_PROVIDERS), description="Only policies of this provider.")


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
        if "provider" in self.request.query_params:
            provider = self.request.query_params["provider"]
            if provider not in KNOWN_PROVIDERS:
                known = ", ".join(KNOWN_PROVIDERS)
                raise exceptions.ValidationError({"provider": [f"Unknown provider; one of {known}."]})
            queryset = queryset.filter(document__provider__name=provider)
        return queryset

    @extend_schema(operation_id="policy_list", tags=["policies"], parameters=[PROVIDER_FILTER],
                   responses={200: PolicySerializer(many=True), **problem_responses()})
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    @write_schema(
        "policy_publish", tag="policies", request=PolicyPublishSerializer,
        summary="Publish a policy document (YAML or JSON text)",
        responses={201: PolicyPublishResultSerializer,
                   200: OpenApiResponse(PolicyPublishResultSerializer, description="Already published, identical")},
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



# --- operations: held provider events and alerts (issue 15) ----------------------------------------
# Staff only (session + CSRF), with the support console's own permissions: tokens never act, and
# never read alerts (they are operational, not one tenant's).


class CanReprocessEvent(_Rule):
    staff_perm = "dunning.reprocess_event"


class CanReadAlerts(_Rule):
    staff_perm = "dunning.view_alert"


class CanAcknowledgeAlert(_Rule):
    staff_perm = "dunning.acknowledge_alert"


class CanResolveAlert(_Rule):
    staff_perm = "dunning.resolve_alert"


PROVIDER_UNAVAILABLE = {(503, PROBLEM_CONTENT_TYPE): OpenApiResponse(
    ProblemSerializer, description="The provider did not answer the fresh fetch: nothing changed; retry later "
                                   "(Retry-After), with the same Idempotency-Key.")}
EVENT_REF = OpenApiParameter("event_id", OpenApiTypes.STR, OpenApiParameter.PATH,
                             description="The provider's event id (evt_…) or the inbox row's local id.")
ALERT_REF = OpenApiParameter("alert_id", OpenApiTypes.INT, OpenApiParameter.PATH, description="The alert's id.")
_LOCAL_ID = re.compile(r"^[0-9]{1,18}$")


def _event(ref: str) -> ProviderEvent:
    lookup = {"pk": int(ref)} if _LOCAL_ID.match(ref) else {"event_id": ref}
    found = list(ProviderEvent.objects.filter(**lookup)[:2])
    if len(found) != 1:
        raise Http404("no such provider event")
    return found[0]


def _alerts() -> QuerySet:
    return Alert.objects.select_related("subscription", "invoice", "owner").prefetch_related(
        Prefetch("actions", queryset=AlertAction.objects.order_by("at", "pk")))


def _alert(alert_id: int | str) -> Alert:
    alert = _alerts().filter(pk=int(alert_id)).first() if _LOCAL_ID.match(str(alert_id)) else None
    if alert is None:
        raise Http404("no such alert")
    return alert


def _reprocess_body(outcome: ReprocessOutcome) -> dict[str, Any]:
    event = outcome.event
    return EventReprocessResultSerializer({
        "still_held": outcome.still_held, "summary": outcome.summary(),
        "event": {"id": event.pk, "event_id": event.event_id, "event_type": event.event_type,
                  "outcome": event.outcome, "outcome_detail": event.outcome_detail,
                  "held": event.outcome in HELD_OUTCOMES, "subscription": event.subscription,
                  "invoice": event.invoice, "received_at": event.received_at, "processed_at": event.processed_at},
        "reprocessing": outcome.attempt,
    }).data


class EventReprocessView(WriteView):
    permission_classes = [CanReprocessEvent]

    @write_schema(
        "event_reprocess", path=(EVENT_REF,), tag="operations", request=EventReprocessRequestSerializer,
        summary="Fetch a held (quarantined or unattributable) event's objects again and re-process it",
        description="Billing leads. The provider's objects are fetched again and the event goes through normal "
                    "processing on that receipt; its previous outcome stays on record in the returned audit row. "
                    "409 when the event is not held (or is being re-processed).",
        responses={200: EventReprocessResultSerializer}, more_responses=PROVIDER_UNAVAILABLE,
    )
    def post(self, request: Request, event_id: str) -> Response:
        event = _event(event_id)
        data = _valid(EventReprocessRequestSerializer, request)
        user = request.user

        def run() -> Response:
            try:
                outcome = event_reprocess(event_pk=event.pk, user=user, reason=data["reason"], ticket=data["ticket"])
            except ReprocessRefused as refused:
                return refusal_response(refused.code, refused.detail,
                                        unprocessable=refused.code in UNPROCESSABLE_REFUSALS)
            if not outcome.provider_answered:
                return problem_response(503, "provider-unavailable", "The payment provider did not answer",
                                        outcome.summary(), headers={"Retry-After": "60"})
            return Response(_reprocess_body(outcome))

        return idempotent_call(request, run)


OPEN_FILTER = OpenApiParameter("open", OpenApiTypes.BOOL, OpenApiParameter.QUERY, required=False,
                               description="true: unresolved alerts only; false: resolved ones only.")
KIND_FILTER = OpenApiParameter("kind", OpenApiTypes.STR, OpenApiParameter.QUERY, required=False,
                               enum=list(AlertKind.values), description="Only alerts of this kind.")
_BOOLEANS = {"true": True, "1": True, "false": False, "0": False}


class AlertListView(ListAPIView):
    """Alerts, newest first, with their owner and audit trail."""

    permission_classes = [CanReadAlerts]
    throttle_scope = "billing_read"
    serializer_class = AlertSerializer

    def get_queryset(self) -> QuerySet:
        queryset = _alerts()
        params = self.request.query_params
        faults = {}
        if "open" in params:
            is_open = _BOOLEANS.get(params["open"].lower())
            if is_open is None:
                faults["open"] = ["Use true or false."]
            else:
                queryset = queryset.filter(resolved_at__isnull=is_open)
        if "kind" in params:
            if params["kind"] not in AlertKind.values:
                faults["kind"] = [f"One of {', '.join(AlertKind.values)}."]
            else:
                queryset = queryset.filter(kind=params["kind"])
        if faults:
            raise exceptions.ValidationError(faults)
        return queryset

    @extend_schema(operation_id="alert_list", parameters=[OPEN_FILTER, KIND_FILTER], tags=["operations"],
                   summary="Alerts (GET /alerts?open=true for the ones still to handle)",
                   responses={200: AlertSerializer(many=True), **problem_responses()})
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)


def _alert_decision(request: Request, alert_id: str, serializer_class: type[Serializer], decide: Any) -> Response:
    alert = _alert(alert_id)
    data = _valid(serializer_class, request)
    user = request.user

    def run() -> Response:
        try:
            decide(alert_pk=alert.pk, user=user, note=data.get("note", ""))
        except AlertRefused as refused:
            return refusal_response(refused.code, refused.detail)
        return Response(AlertSerializer(_alert(alert.pk)).data)

    return idempotent_call(request, run)


class AlertAcknowledgeView(WriteView):
    permission_classes = [CanAcknowledgeAlert]

    @write_schema(
        "alert_acknowledge", path=(ALERT_REF,), tag="operations", request=AlertAcknowledgeSerializer,
        summary="Acknowledge an alert: you own it from now on",
        description="Support agents and billing leads. Taking over someone else's alert is allowed and audited; "
                    "a resolved alert is 409.",
        responses={200: AlertSerializer},
    )
    def post(self, request: Request, alert_id: str) -> Response:
        return _alert_decision(request, alert_id, AlertAcknowledgeSerializer, alert_acknowledge)


class AlertResolveView(WriteView):
    permission_classes = [CanResolveAlert]

    @write_schema(
        "alert_resolve", path=(ALERT_REF,), tag="operations", request=AlertResolveSerializer,
        summary="Resolve an alert, saying what was done",
        description="Support agents and billing leads. The note is required and audited; a resolved alert is 409.",
        responses={200: AlertSerializer},
    )
    def post(self, request: Request, alert_id: str) -> Response:
        return _alert_decision(request, alert_id, AlertResolveSerializer, alert_resolve_by_staff)
