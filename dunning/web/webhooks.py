"""POST /webhooks/<provider>/ — parse the request, hand it to the intake service, answer fast, in
the form the provider expects (its adapter's `answer_notification`).

`WebhookRoute` (first in settings.MIDDLEWARE) takes the webhook URL straight to its view: a provider
posting an event needs no session, user, messages, CSRF token, history context or browser headers,
and the rest of the middleware chain cost a delivery about a tenth of its CPU time. Every other URL
(the admin, the console, the pages, the API) goes through the whole chain as before."""

from __future__ import annotations

import functools
from collections.abc import Callable

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import Resolver404, ResolverMatch, resolve
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from dunning.evidence.intake import webhook_receive
from subscriptions.providers.registry import PROVIDER_NAMES, get_provider

# Mirrors config/urls.py; the URL's view is still found by resolving it there.
WEBHOOK_PREFIX = "/webhooks/"


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
    response = HttpResponse(answer.body, status=answer.status, content_type=answer.content_type)
    response.headers["Content-Length"] = str(len(response.content))  # not chunked, with or without the chain
    return response


class WebhookRoute:
    """A request for the provider webhook goes from here to its view, past the rest of the chain;
    the Host header is still checked against ALLOWED_HOSTS (CommonMiddleware's check, a 400), and
    an exception still becomes Django's 404 / 405 / 500 answer. Anything else passes on."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path_info.startswith(WEBHOOK_PREFIX):
            return self.get_response(request)
        match = _webhook_match(settings.ROOT_URLCONF, request.path_info)
        if match is None:
            return self.get_response(request)
        request.get_host()  # DisallowedHost -> 400, as CommonMiddleware would
        request.resolver_match = match
        return provider_webhook(request, *match.args, **match.kwargs)


@functools.lru_cache(maxsize=64)
def _webhook_match(urlconf: str, path_info: str) -> ResolverMatch | None:
    """The webhook view's match for a path (None: another view's path, or none's). Cached: resolving
    tries the URL patterns before the webhook's, the admin's included, about 0.1 ms a request; the
    providers' paths are few, and any other path under the prefix only evicts."""
    try:
        match = resolve(path_info, urlconf)
    except Resolver404:
        return None
    return match if match.func is provider_webhook else None
