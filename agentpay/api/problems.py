"""RFC 9457 problem documents for every AgentPay error: one builder, one set of slugs.

Own type URIs (https://agentpay.invalid/problems/<slug>) so agents can branch on them; the
gateway marks the answer with the slug so the request log records why it refused.
"""

from __future__ import annotations

import logging
from typing import Any

from django.http import Http404, JsonResponse
from rest_framework import exceptions
from rest_framework.views import set_rollback

PROBLEM_BASE = "https://agentpay.invalid/problems/"
PROBLEM_CONTENT_TYPE = "application/problem+json"
log = logging.getLogger(__name__)


def problem(status: int, slug: str, title: str, detail: str = "", *, headers: dict[str, str] | None = None,
            **extra: Any) -> JsonResponse:
    body: dict[str, Any] = {"type": PROBLEM_BASE + slug, "title": title, "status": status}
    if detail:
        body["detail"] = detail
    body.update(extra)
    response = JsonResponse(body, status=status, content_type=PROBLEM_CONTENT_TYPE, headers=headers)
    response.agentpay_problem = slug  # read by the request log
    return response


_DRF = (
    (exceptions.NotAuthenticated, "not-authenticated", "Authentication is required"),
    (exceptions.AuthenticationFailed, "authentication-failed", "Authentication failed"),
    (exceptions.PermissionDenied, "forbidden", "You may not do this"),
    (exceptions.NotFound, "not-found", "Not found"),
    (exceptions.MethodNotAllowed, "method-not-allowed", "Method not allowed"),
    (exceptions.ParseError, "malformed-request", "The request body could not be parsed"),
    (exceptions.ValidationError, "validation-error", "The request is not valid"),
)


def agentpay_exception_handler(exc: Exception, context: dict[str, Any]) -> JsonResponse:
    """Every exception in an AgentPay API view becomes a problem document; an unexpected one is
    logged with its traceback and answered 500 without internals."""
    if isinstance(exc, Http404):
        exc = exceptions.NotFound(str(exc) or "Not found")
    set_rollback()
    if not isinstance(exc, exceptions.APIException):
        log.error("unhandled AgentPay API error", exc_info=exc)
        return problem(500, "internal-error", "Internal error",
                       "The request failed on our side; retrying with the same Idempotency-Key is safe.")
    slug, title = "error", "Error"
    for cls, s, t in _DRF:
        if isinstance(exc, cls):
            slug, title = s, t
            break
    headers = {}
    if getattr(exc, "auth_header", None):
        headers["WWW-Authenticate"] = exc.auth_header
    return problem(exc.status_code, slug, title, str(exc.detail), headers=headers)
