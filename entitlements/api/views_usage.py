"""Usage-record endpoints (issue 19 item 4): producers report usage, billing reads and exports it.

- ``POST /api/v1/usage-records/`` — a producer (service token with scope ``usage:write``) reports
  one record. The body's ``producer_record_id`` is the idempotency key, kept for ever with the
  record (not the 24 h of the ``Idempotency-Key`` header, which this endpoint does not need): a
  producer replaying its own log a month later must still not double-count. Answers follow the
  API's Idempotency-Key conventions: 201 created; 200 with ``Idempotent-Replayed: true`` for the
  same id and body; 422 ``producer-record-id-reused`` for the same id with another body (the
  request is well formed, it contradicts what is stored, like ``idempotency-key-reused``);
  400 with field faults for malformed input; 404 for a subscription unknown or outside the token.
  Accepted whatever the subscription's entitlement profile, REVOKED included.
- ``POST /api/v1/usage-records/batch/`` — up to 500 records. Every record is checked first (field
  faults → 400, an unknown subscription → 404; nothing written). Then each is recorded on its own,
  and the answer lists each outcome (201, 200 replay, 422 conflict): a conflicting id must not make
  the producer drop the rest of its usage.
- ``GET /api/v1/subscriptions/<ref>/usage/`` — the records, newest first (cursor pages).
- ``GET /api/v1/subscriptions/<ref>/usage/export.csv`` / ``export.json`` — every record and the
  totals, in every entitlement profile: usage already consumed stays exportable when access ends.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions
from rest_framework.generics import ListAPIView
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from dunning.clock import trusted_now
from entitlements.api.auth import SCOPE_USAGE_WRITE, CanReadBilling, ServicePrincipal
from entitlements.api.idempotency import REPLAYED_HEADER
from entitlements.api.problems import problem_response, problem_responses
from entitlements.api.selectors import subscription_for_request
from entitlements.api.serializers_usage import (
    UsageBatchRequestSerializer,
    UsageBatchResultSerializer,
    UsageExportSerializer,
    UsageRecordRequestSerializer,
    UsageRecordSerializer,
)
from entitlements.api.views_read import SUBSCRIPTION_REF
from subscriptions.usage import UsageConflict, UsageInput, UsageInvalid, usage_check, usage_record
from subscriptions.usage_reads import export_csv_lines, export_rows, usage_records_of, usage_totals

CSV_CONTENT_TYPE = "text/csv; charset=utf-8"


class CanRecordUsage(BasePermission):
    """Only a producer's service token with ``usage:write``: staff do not meter usage."""

    message = "Reporting usage needs a service token with the usage:write scope."

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        return isinstance(user, ServicePrincipal) and SCOPE_USAGE_WRITE in user.token.scopes


def _record_body(record: Any) -> dict[str, Any]:
    return UsageRecordSerializer(record).data


def _usage_input(data: dict[str, Any]) -> UsageInput:
    return UsageInput(producer_record_id=data["producer_record_id"], metric=data["metric"],
                      quantity=data["quantity"], cost=data["cost"], currency=data["currency"],
                      occurred_at=data["occurred_at"])


class UsageRecordCreateView(APIView):
    permission_classes = [CanRecordUsage]
    throttle_scope = "usage_write"

    @extend_schema(
        operation_id="usage_record_create", tags=["usage"], request=UsageRecordRequestSerializer,
        summary="Report usage (tokens or calls and their cost); idempotent on producer_record_id",
        description="Service tokens with scope usage:write. Accepted in every entitlement profile, REVOKED "
                    "included: usage already consumed is recorded, never refused. Never touches dunning cycles "
                    "or debt. The same producer_record_id with the same body answers the stored record (200, "
                    "Idempotent-Replayed: true); with a different body 422 producer-record-id-reused.",
        responses={201: UsageRecordSerializer,
                   200: OpenApiResponse(UsageRecordSerializer, description="Replay: already recorded, identical"),
                   **problem_responses(415, 422)},
    )
    def post(self, request: Request) -> Response:
        serializer = UsageRecordRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        subscription = subscription_for_request(request, data["subscription"])
        usage = _usage_input(data)
        try:
            outcome = usage_record(subscription=subscription, producer=request.user.token, usage=usage,
                                   now=trusted_now())
        except UsageInvalid as invalid:
            raise exceptions.ValidationError({field: [message] for field, message in invalid.errors.items()}) \
                from None
        except UsageConflict as conflict:
            return problem_response(
                422, "producer-record-id-reused", "producer_record_id reused with a different body",
                f"{conflict}. The stored record is unchanged.", record=conflict.existing.pk)
        body = _record_body(outcome.record)
        if outcome.created:
            location = f"/api/v1/subscriptions/{subscription.pk}/usage/"
            return Response(body, status=201, headers={"Location": location})
        return Response(body, status=200, headers={REPLAYED_HEADER: "true"})


class UsageRecordBatchView(APIView):
    permission_classes = [CanRecordUsage]
    throttle_scope = "usage_write"

    @extend_schema(
        operation_id="usage_record_batch", tags=["usage"], request=UsageBatchRequestSerializer,
        summary="Report up to 500 usage records at once; each idempotent on its producer_record_id",
        description="Every record is checked before any is recorded: a field fault answers 400 (field "
                    "records.<i>.<name>) and an unknown subscription 404, with nothing written. Then each record is "
                    "recorded on its own and `results` gives each outcome: 201 recorded, 200 already recorded "
                    "identically, 422 its id was recorded with a different body (that record changes nothing; the "
                    "others are still recorded, so no usage is lost to one conflict).",
        responses={200: UsageBatchResultSerializer, **problem_responses(415)},
    )
    def post(self, request: Request) -> Response:
        serializer = UsageBatchRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        items = [(subscription_for_request(request, data["subscription"]), _usage_input(data))
                 for data in serializer.validated_data["records"]]
        now = trusted_now()
        faults = {f"records.{i}.{field}": [message] for i, (subscription, usage) in enumerate(items)
                  for field, message in usage_check(subscription, usage, now).items()}
        if faults:
            raise exceptions.ValidationError(faults)
        results = []
        for index, (subscription, usage) in enumerate(items):
            try:
                outcome = usage_record(subscription=subscription, producer=request.user.token, usage=usage, now=now)
            except UsageConflict as conflict:
                results.append({"index": index, "status": 422, "record": None, "detail": str(conflict)})
            except UsageInvalid as invalid:  # the currency was set by a record racing this batch
                raise exceptions.ValidationError({f"records.{index}.{field}": [message]
                                                  for field, message in invalid.errors.items()}) from None
            else:
                results.append({"index": index, "status": 201 if outcome.created else 200,
                                "record": outcome.record, "detail": ""})
        counts = {status: sum(1 for r in results if r["status"] == status) for status in (201, 200, 422)}
        return Response(UsageBatchResultSerializer({"created": counts[201], "replayed": counts[200],
                                                    "conflicts": counts[422], "results": results}).data)


class SubscriptionUsageListView(ListAPIView):
    """Usage records of one subscription, newest first."""

    permission_classes = [CanReadBilling]
    throttle_scope = "billing_read"
    serializer_class = UsageRecordSerializer

    def get_queryset(self) -> QuerySet:
        subscription = subscription_for_request(self.request, self.kwargs["ref"])
        return usage_records_of(subscription).select_related("producer", "subscription")

    @extend_schema(operation_id="subscription_usage_list", parameters=[SUBSCRIPTION_REF], tags=["usage"],
                   summary="Usage records of a subscription, newest first",
                   responses={200: UsageRecordSerializer(many=True), **problem_responses()})
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)


EXPORT_DESCRIPTION = ("Every usage record of the subscription, oldest first. Works in every entitlement profile, "
                      "REVOKED included: usage already consumed stays exportable when access ends.")


class SubscriptionUsageExportCsvView(APIView):
    permission_classes = [CanReadBilling]
    throttle_scope = "billing_read"

    @extend_schema(operation_id="subscription_usage_export_csv", parameters=[SUBSCRIPTION_REF], tags=["usage"],
                   summary="Export the usage records as CSV", description=EXPORT_DESCRIPTION,
                   responses={(200, "text/csv"): OpenApiResponse(OpenApiTypes.STR, description="CSV, a record a line"),
                              **problem_responses()})
    def get(self, request: Request, ref: str) -> StreamingHttpResponse:
        subscription = subscription_for_request(request, ref)
        response = StreamingHttpResponse(export_csv_lines(subscription), content_type=CSV_CONTENT_TYPE)
        response["Content-Disposition"] = f'attachment; filename="usage-{subscription.pk}.csv"'
        return response


class SubscriptionUsageExportJsonView(APIView):
    permission_classes = [CanReadBilling]
    throttle_scope = "billing_read"

    @extend_schema(operation_id="subscription_usage_export_json", parameters=[SUBSCRIPTION_REF], tags=["usage"],
                   summary="Export the usage records and their totals as JSON", description=EXPORT_DESCRIPTION,
                   responses={200: UsageExportSerializer, **problem_responses()})
    def get(self, request: Request, ref: str) -> Response:
        subscription = subscription_for_request(request, ref)
        totals = usage_totals(subscription)
        body = {
            "subscription": subscription.pk, "provider_subscription_id": subscription.provider_subscription_id,
            "entitlement_profile": subscription.entitlement_profile, "exported_at": trusted_now(),
            "currency": totals.currency,
            "totals": [{"metric": m.metric, "records": m.records, "quantity": m.quantity, "cost": m.cost,
                        "uninvoiced_quantity": m.uninvoiced_quantity, "uninvoiced_cost": m.uninvoiced_cost,
                        "invoiced_quantity": m.invoiced_quantity, "invoiced_cost": m.invoiced_cost}
                       for m in totals.metrics],
            "records": list(export_rows(subscription)),
        }
        return Response(UsageExportSerializer(body).data,
                        headers={"Content-Disposition": f'attachment; filename="usage-{subscription.pk}.json"'})
