"""RFC 9457 problem documents with stable type URIs, for every client-facing error."""

from __future__ import annotations

from typing import Any

from django.http import JsonResponse

PROBLEM_BASE = "https://dunning.invalid/problems/"
PROBLEM_CONTENT_TYPE = "application/problem+json"


def problem_body(status: int, slug: str, title: str, detail: str = "", **extra: Any) -> dict[str, Any]:
    """The document itself; the slug is spelled lowercase with hyphens (ATTEMPT_PENDING → attempt-pending)."""
    body: dict[str, Any] = {"type": PROBLEM_BASE + slug.lower().replace("_", "-"), "title": title, "status": status}
    if detail:
        body["detail"] = detail
    body.update(extra)
    return body


def problem(status: int, slug: str, title: str, detail: str = "", **extra: Any) -> JsonResponse:
    return JsonResponse(problem_body(status, slug, title, detail, **extra), status=status,
                        content_type=PROBLEM_CONTENT_TYPE)
