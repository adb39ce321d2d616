"""RFC 9457 problem documents with stable type URIs, for every client-facing error."""

from __future__ import annotations

from typing import Any

from django.http import JsonResponse

PROBLEM_BASE = "https://dunning.invalid/problems/"


def problem(status: int, slug: str, title: str, detail: str = "", **extra: Any) -> JsonResponse:
    body = {"type": PROBLEM_BASE + slug.lower().replace("_", "-"), "title": title, "status": status}
    if detail:
        body["detail"] = detail
    body.update(extra)
    return JsonResponse(body, status=status, content_type="application/problem+json")
