"""POST /webhooks/<provider>/ — parse the request, hand it to the intake service, answer fast, in
the form the provider expects (its adapter's `answer_notification`)."""

from __future__ import annotations

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from dunning.evidence.intake import webhook_receive
from subscriptions.providers.registry import PROVIDER_NAMES, get_provider


@csrf_exempt
@require_POST
def provider_webhook(request: HttpRequest, provider_name: str) -> HttpResponse:
    if provider_name not in PROVIDER_NAMES:
        raise Http404(f"no provider {provider_name!r}")
    limit = settings.WEBHOOK_MAX_BODY_BYTES
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    # Read at most limit + 1 bytes: enough to know the body is too large, never the whole of it.
    body = request.read(limit + 1)
    outcome = webhook_receive(
        provider_name=provider_name, body=body, headers=dict(request.headers),
        remote_addr=request.META.get("REMOTE_ADDR"), declared_size=declared, size_limit=limit,
    )
    answer = get_provider(provider_name).answer_notification(status=outcome.status, code=outcome.code,
                                                             detail=outcome.detail, body=outcome.body)
    return HttpResponse(answer.body, status=answer.status, content_type=answer.content_type)
