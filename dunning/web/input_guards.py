"""Hostile input stops at the edge as a clear 4xx, never as a database error (a 500).

PostgreSQL cannot hold NUL (U+0000) in text, jsonb or varchar: a query or insert carrying one
fails inside the database driver, wherever it came from (a URL id, an admin filter, a cookie, a
signed webhook field, a policy document). Over-long values overflow their varchar column the
same way. The checks are named once, in dunning.storable, and used by the webhook intake, the API
selectors, the policy publisher and this middleware. `HostileInputGuard` (settings.MIDDLEWARE)
refuses a request whose URL or session cookie carries a NUL before a view runs, so no admin
search, changelist filter, change page or API path reaches the database with one, and refuses
admin ids their model's primary key cannot hold.
The webhook endpoint is left to its own intake, which keeps every raw request (with a verdict)
and answers 400 itself.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any

from django.conf import settings
from django.contrib.admin import ModelAdmin
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.utils import unquote
from django.core.exceptions import ValidationError
from django.db.models import Field
from django.http import HttpRequest, HttpResponse

from dunning.storable import NUL, escape_nul, storable_text
from dunning.web.problems import problem

# Mirrors config/urls.py: the REST API answers problem documents; the webhook answers for itself.
API_PREFIX = "/api/"
WEBHOOK_PREFIX = "/webhooks/"
FORM_CONTENT_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def _strings(request: HttpRequest) -> Iterator[tuple[str, str]]:
    """(where, text) of every string of the URL, and the session cookie."""
    yield "the path", request.path_info
    for key, values in request.GET.lists():
        yield "the query string", key
        for value in values:
            yield f"query parameter {escape_nul(key)[:64]!r}", value
    # The session cookie is the one cookie whose value is looked up in the database.
    yield "the session cookie", request.COOKIES.get(settings.SESSION_COOKIE_NAME, "")


class HostileInputGuard:
    """Answer 400 to a request whose URL or session cookie holds a NUL (a problem document under the API, a
    plain message elsewhere) before any view runs; and, in the admin, answer ids in the address or
    in a changelist action's selection that their model's primary key cannot hold (NUL, over-long,
    not a number) with 404 / 400 instead of letting the view query with them.

    Form fields are left to Django's forms, which refuse a NUL in every text field with a message
    beside the field (the support console's reason and ticket, the login form)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path_info.startswith(WEBHOOK_PREFIX):
            for where, text in _strings(request):
                if NUL in text:
                    return self._refuse(request, where)
        return self.get_response(request)

    def process_view(self, request: HttpRequest, view_func: Callable[..., Any], view_args: tuple[Any, ...],
                     view_kwargs: dict[str, Any]) -> HttpResponse | None:
        model_admin = _model_admin(view_func)
        if model_admin is None:
            return None
        opts = model_admin.model._meta
        ids = _view_arguments(view_func, request, view_args, view_kwargs)
        object_id = ids.get("object_id")
        if object_id is not None and not _is_pk(opts.pk, unquote(str(object_id))):
            return _plain(404, f"Not found: no {opts.verbose_name} has the id given in this address.")
        version_id = ids.get("version_id")  # django-simple-history's page of one past version
        history = getattr(model_admin.model, "history", None)
        if version_id is not None and history is not None and not _is_pk(history.model._meta.pk, str(version_id)):
            return _plain(404, f"Not found: no past version of a {opts.verbose_name} has the id given in this "
                               f"address.")
        if request.method == "POST" and request.content_type in FORM_CONTENT_TYPES:
            selected = request.POST.getlist(ACTION_CHECKBOX_NAME)
            if not all(_is_pk(opts.pk, value) for value in selected):
                return _plain(400, f"Bad request: the selection holds a value that no {opts.verbose_name} has as "
                                   f"its id. Select the rows again.")
        return None

    @staticmethod
    def _refuse(request: HttpRequest, where: str) -> HttpResponse:
        detail = (f"{where[:1].upper()}{where[1:]} contains a NUL character (%00 / \\u0000); no id, search or "
                  f"value can hold one. Remove it and send the request again.")
        if request.path_info.startswith(API_PREFIX):
            return problem(400, "nul-character", "The request contains a NUL character", detail)
        return _plain(400, f"Bad request: {detail}")


def _plain(status: int, message: str) -> HttpResponse:
    return HttpResponse(f"{message}\n", status=status, content_type="text/plain; charset=utf-8")


def _model_admin(view_func: Callable[..., Any]) -> Any:
    """The ModelAdmin behind an admin view (None for any other view): Django marks its own URLs
    with it; a view an admin adds itself (django-simple-history's) is its bound method under the
    admin_view wrappers."""
    found = getattr(view_func, "model_admin", None) or getattr(inspect.unwrap(view_func), "__self__", None)
    return found if isinstance(found, ModelAdmin) else None


def _view_arguments(view_func: Callable[..., Any], request: HttpRequest, view_args: tuple[Any, ...],
                    view_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The view's arguments by name, whether its URL captured them by name or by position."""
    try:
        bound = inspect.signature(inspect.unwrap(view_func)).bind_partial(request, *view_args, **view_kwargs)
    except (TypeError, ValueError):
        return dict(view_kwargs)
    return dict(bound.arguments)


def _is_pk(pk: Field, raw: str) -> bool:
    """Whether `raw` can name a row by the primary key `pk` (Django's admin get_object asks the same)."""
    try:
        value = pk.to_python(raw)
    except (ValidationError, ValueError, TypeError, OverflowError):
        return False
    return storable_text(value, pk.max_length) if isinstance(value, str) else True
