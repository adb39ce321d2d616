"""POST /webhooks/stripe/ — parse the request, hand it to the intake service, answer fast."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from dunning.evidence.intake import webhook_receive
from dunning.web.problems import problem

TITLES = {
    "BODY_TOO_LARGE": "Webhook body too large",
    "MALFORMED_EVENT": "Not a provider event",
    "MALFORMED_PAYLOAD": "Webhook payload is not a JSON event",
    "TIMESTAMP_TOO_OLD": "Webhook signature too old",
    "TIMESTAMP_IN_FUTURE": "Webhook signature from the future",
}


@csrf_exempt
@require_POST
def stripe_webhook(request: HttpRequest) -> HttpResponse:
    limit = settings.WEBHOOK_MAX_BODY_BYTES
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    # Read at most limit + 1 bytes: enough to know the body is too large, never the whole of it.
    body = request.read(limit + 1)
    outcome = webhook_receive(
        provider_name="stripe", body=body, headers=dict(request.headers), remote_addr=request.META.get("REMOTE_ADDR"),
        declared_size=declared, size_limit=limit,
    )
    if outcome.status == 200:
        return JsonResponse(outcome.body)
    title = TITLES.get(outcome.code, "Webhook signature verification failed")
    return problem(outcome.status, f"webhook-{outcome.code}", title, outcome.detail, code=outcome.code)
