"""A priced call (`/agentpay/v1/routes/…`) skips the browser's middleware.

`PricedCallRoute` comes right after the request log (settings.MIDDLEWARE). A tenant's agent calling
a priced route authenticates with an API key on every call: it has no session, no logged-in user,
no flash messages and no CSRF token (the view is exempt), and no model it writes keeps history. So
the call goes from here through the rest of the chain without those five middleware, and without
Django resolving its URL a second time. It keeps everything else: the security and clickjacking
headers, the Host check (400) and the hostile-input guard (a NUL in the URL is a 400 problem).
The admin, the intent read and every other URL pass on through the whole chain
(tests/agentpay/test_priced_route.py). The same idea as the provider webhook's route
(dunning.web.webhooks.WebhookRoute), which skips more: a provider needs none of the headers.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from django.conf import settings
from django.core.handlers.exception import convert_exception_to_response
from django.http import HttpRequest, HttpResponse
from django.urls import Resolver404, ResolverMatch, resolve
from django.utils.module_loading import import_string

from agentpay.api.request_log import DEFERRED_PREFIX
from agentpay.api.views import RouteCallView

# What a call authenticated by an API key never uses (the module's docstring).
SKIPPED = frozenset({
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "simple_history.middleware.HistoryRequestMiddleware",
})
ME = "agentpay.api.priced_route.PricedCallRoute"


class PricedCallRoute:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        after = settings.MIDDLEWARE[settings.MIDDLEWARE.index(ME) + 1:]
        handler: Callable[[HttpRequest], HttpResponse] = convert_exception_to_response(self._view)
        self.process_views: list[Callable[..., HttpResponse | None]] = []
        # Built as Django builds its chain, innermost first: each wrapped to turn exceptions into answers.
        for path in reversed([path for path in after if path not in SKIPPED]):
            middleware = import_string(path)(handler)
            if hasattr(middleware, "process_view"):
                self.process_views.insert(0, middleware.process_view)
            handler = convert_exception_to_response(middleware)
        self.chain = handler

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path_info.startswith(DEFERRED_PREFIX):
            return self.get_response(request)
        match = _priced_call_match(getattr(request, "urlconf", None) or settings.ROOT_URLCONF, request.path_info)
        if match is None:
            return self.get_response(request)
        request.resolver_match = match
        return self.chain(request)

    def _view(self, request: HttpRequest) -> HttpResponse:
        match: ResolverMatch = request.resolver_match
        for process_view in self.process_views:
            answer = process_view(request, match.func, match.args, match.kwargs)
            if answer is not None:
                return answer
        response = match.func(request, *match.args, **match.kwargs)
        if callable(getattr(response, "render", None)):  # a template response, rendered as Django's handler does
            response = response.render()
        return response


@functools.lru_cache(maxsize=256)
def _priced_call_match(urlconf: str, path_info: str) -> ResolverMatch | None:
    """The priced-call view's match for a path (None: another view's, or none). Cached: an agent
    calls the same few routes again and again; any other path only evicts."""
    try:
        match = resolve(path_info, urlconf)
    except Resolver404:
        return None
    return match if getattr(match.func, "view_class", None) is RouteCallView else None
