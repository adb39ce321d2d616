"""RFC 9457 problem documents for every API error, built by `dunning.web.problems` (stable type URIs
https://dunning.invalid/problems/<slug>) and answered as DRF responses."""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404
from drf_spectacular.utils import OpenApiResponse
from rest_framework import exceptions, serializers
from rest_framework.response import Response
from rest_framework.views import set_rollback

from dunning.web.problems import PROBLEM_CONTENT_TYPE, problem_body

log = logging.getLogger(__name__)

# DRF exception class -> stable slug. Order matters: subclasses first.
_SLUGS: tuple[tuple[type[exceptions.APIException], str, str], ...] = (
    (exceptions.ValidationError, "validation-error", "The request is not valid"),
    (exceptions.ParseError, "malformed-request", "The request body could not be parsed"),
    (exceptions.NotAuthenticated, "not-authenticated", "Authentication is required"),
    (exceptions.AuthenticationFailed, "authentication-failed", "Authentication failed"),
    (exceptions.PermissionDenied, "forbidden", "You may not do this"),
    (exceptions.NotFound, "not-found", "Not found"),
    (exceptions.MethodNotAllowed, "method-not-allowed", "Method not allowed"),
    (exceptions.NotAcceptable, "not-acceptable", "Cannot produce an acceptable response"),
    (exceptions.UnsupportedMediaType, "unsupported-media-type", "Unsupported media type"),
    (exceptions.Throttled, "rate-limited", "Too many requests"),
)


def problem_response(status: int, slug: str, title: str, detail: str = "", *,
                     headers: dict[str, str] | None = None, **extra: Any) -> Response:
    return Response(problem_body(status, slug, title, detail, **extra), status=status,
                    content_type=PROBLEM_CONTENT_TYPE, headers=headers)


def _field_errors(data: Any, path: str = "") -> list[dict[str, str]]:
    """Flatten DRF's nested error structure into [{field, message, code}]."""
    out: list[dict[str, str]] = []
    if isinstance(data, dict):
        for key, value in data.items():
            name = "" if key == "non_field_errors" else str(key)
            out += _field_errors(value, f"{path}.{name}" if path and name else (name or path))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            if isinstance(value, dict | list):
                out += _field_errors(value, f"{path}[{i}]")
            else:
                out += _field_errors(value, path)
    else:
        out.append({"field": path, "message": str(data), "code": getattr(data, "code", "invalid")})
    return out


def problem_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF EXCEPTION_HANDLER: every exception raised in an API view becomes a problem document
    (Django's 404 / PermissionDenied too); unexpected ones are logged and answered 500."""
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    if not isinstance(exc, exceptions.APIException):
        # Unexpected: log it with its traceback and answer a problem document without internals.
        log.error("unhandled API error in %s", context.get("view").__class__.__name__, exc_info=exc)
        set_rollback()
        return problem_response(500, "internal-error", "Internal error",
                                "The request failed on our side; it is safe to retry with the same Idempotency-Key.")
    slug, title = "error", "Error"
    for cls, s, t in _SLUGS:
        if isinstance(exc, cls):
            slug, title = s, t
            break
    headers: dict[str, str] = {}
    if getattr(exc, "auth_header", None):
        headers["WWW-Authenticate"] = exc.auth_header  # type: ignore[attr-defined]
    if getattr(exc, "wait", None):
        headers["Retry-After"] = str(int(exc.wait))  # type: ignore[attr-defined]
    extra: dict[str, Any] = {}
    if isinstance(exc, exceptions.ValidationError):
        extra["errors"] = _field_errors(exc.detail)
        detail = "; ".join(f"{e['field'] or 'request'}: {e['message']}" for e in extra["errors"])
    else:
        detail = str(exc.detail)
    set_rollback()
    return problem_response(exc.status_code, slug, title, detail, headers=headers, **extra)


# --- schema ----------------------------------------------------------------------------------------


class FieldFaultSerializer(serializers.Serializer):
    field = serializers.CharField()
    message = serializers.CharField()
    code = serializers.CharField()


class ProblemSerializer(serializers.Serializer):
    """RFC 9457 problem document."""

    type = serializers.URLField()
    title = serializers.CharField()
    status = serializers.IntegerField()
    detail = serializers.CharField(required=False)
    code = serializers.CharField(required=False, help_text="Stable refusal code of the service, when refused.")
    errors = FieldFaultSerializer(many=True, required=False, help_text="Field faults of a validation error.")


_DESCRIPTIONS = {
    400: "Invalid input (problem document with field faults)",
    401: "Not authenticated (WWW-Authenticate tells how)",
    403: "Authenticated but not permitted",
    404: "Not found (or outside the token's restriction)",
    405: "Method not allowed",
    406: "Not acceptable",
    409: "Conflict: refused by the service, or the Idempotency-Key is in flight",
    415: "Unsupported media type",
    422: "Refused as unprocessable, or the Idempotency-Key was used with a different request",
    429: "Rate limited (Retry-After)",
}

COMMON_ERRORS = (400, 401, 403, 404, 405, 406, 429)


def problem_responses(*codes: int) -> dict[Any, OpenApiResponse]:
    return {(code, PROBLEM_CONTENT_TYPE): OpenApiResponse(ProblemSerializer, description=_DESCRIPTIONS[code])
            for code in sorted(set(COMMON_ERRORS + codes))}
