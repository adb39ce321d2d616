"""Every request to /agentpay/ is recorded with its request_id (UUIDv4), bad ones included.

The first middleware: the row (raw body, a subset of headers, never the API key) is made on
arrival, before anything can refuse the request, and answered when the response leaves. The
request id is in the `X-Request-Id` answer header and in the receipts the request causes.

When the row is written: on arrival, for every URL but a priced call's. A priced call
(`/agentpay/v1/routes/…`) has its row written with the first thing the call changes: in the
intent's open (intent_open writes it in the same transaction, in the 402's one statement), or by
the view (`request_log_write`) when the key found an intent already, before anything else is
done with it. A call refused before that (a bad key, a bad body, an unknown route), or ending in
an exception, changed nothing: its row is written once, with its answer, as the response leaves.
So a crash never leaves an intent, or a step a request took, without the request's row.

The answer is written with the row when the view knows it before the row is written: an unpaid
on-chain call that opens its intent challenged answers 402 payment-required and nothing else
(`request_log_expect`), so the open's one statement writes the row with that answer, its time
and duration taken then, and no UPDATE follows. The middleware still compares: a response other
than the expected one (the open fell back, the key found an intent, an exception) is written
over it by the UPDATE, so every row ends with the answer the client got. Likewise a wallet
call whose upstream answered 2xx or 4xx is answered with that answer, relayed, once its capture
or release is accepted: the acceptance's statement writes it into the row the open wrote
(`request_log_answer`), and no UPDATE follows when that is the answer sent.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Callable

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import DEFAULT_DB_ALIAS, connections
from django.http import HttpRequest, HttpResponse

from agentpay.api.problems import problem
from agentpay.bridge import desensitised_body, health_check_without_round_trip, trusted_now, unsaved_row
from agentpay.models import GatewayRequest
from agentpay.services.results import RequestAnswer

PREFIX = "/agentpay/"
# A priced call: its row is written with the first thing it changes (the module's docstring).
DEFERRED_PREFIX = "/agentpay/v1/routes/"
# The protocol's 402 (agentpay.api.onchain): (status, problem slug).
PAYMENT_REQUIRED_ANSWER = (402, "payment-required")
KEPT_HEADERS = ("content-type", "content-length", "idempotency-key", "user-agent", "agentpay-amount",
                "agentpay-currency", "agentpay-rail", "payment-signature")
log = logging.getLogger("agentpay.gateway")


def storable(text: str) -> str:
    """PostgreSQL text cannot hold NUL: write it as the six characters \\u0000."""
    return text.replace("\x00", "\\u0000").encode("utf-8", "replace").decode("utf-8")


def _headers(request: HttpRequest) -> dict[str, str]:
    kept = {name: storable(request.headers[name])[:1000] for name in KEPT_HEADERS if name in request.headers}
    auth = request.headers.get("authorization", "")
    if auth:
        kept["authorization"] = storable(auth[:17]) + "…"  # "Bearer ak_" + a few characters
    return kept


class GatewayRequestLog:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path.startswith(PREFIX):
            return self.get_response(request)
        # Before the first statement: Django's CONN_HEALTH_CHECKS would ask a reused connection
        # SELECT 1 on every call (a third of an unpaid call's round trips); a quiet socket needs none.
        health_check_without_round_trip(connections[DEFAULT_DB_ALIAS])
        request_id = uuid.uuid4()
        request.agentpay_request_id = request_id
        request.agentpay_started = time.monotonic()
        too_big = False
        try:
            length = int(request.headers.get("content-length") or 0)
        except ValueError:
            length = 0
        if length > settings.AGENTPAY_MAX_BODY_BYTES:
            body, too_big = b"", True
        else:
            try:
                body = request.body
            except RequestDataTooBig:
                body, too_big = b"", True
        # Logged desensitised (a forwarded call can carry an end user's email or card); the digest
        # and size are of the raw bytes.
        kept = desensitised_body(body[: settings.AGENTPAY_LOGGED_BODY_BYTES])
        record = unsaved_row(
            GatewayRequest, request_id=request_id, received_at=trusted_now(),
            method=storable(request.method or "")[:16],
            path=storable(request.path), query=storable(request.META.get("QUERY_STRING", "")),
            headers=_headers(request), body=kept, body_size=len(body) or length,
            body_digest=hashlib.sha256(body).hexdigest(),
            body_truncated=too_big or len(body) > settings.AGENTPAY_LOGGED_BODY_BYTES,
            idempotency_key=storable(request.headers.get("idempotency-key", ""))[:1000])
        request.agentpay_log = record
        request.agentpay_logged = False
        request.agentpay_answer_written = None  # (status, problem) the row was written with
        if not request.path.startswith(DEFERRED_PREFIX):
            request_log_write(request)
        if too_big:
            response = problem(413, "body-too-large", "The request body is too large",
                               f"at most {settings.AGENTPAY_MAX_BODY_BYTES} bytes", request_id=str(request_id))
        else:
            response = self.get_response(request)  # an exception is already a 500 answer here
        response["X-Request-Id"] = str(request_id)
        status, slug = response.status_code, getattr(response, "agentpay_problem", "")[:64]
        if (status, slug) == PAYMENT_REQUIRED_ANSWER:
            # x402's normal first answer, not a client error: no django.request warning per 402
            # (formatting a record each); the line below logs it with its request_id.
            response._has_been_logged = True
        answer = {"tenant": getattr(request, "agentpay_tenant", None),
                  "route": getattr(request, "agentpay_route", None),
                  "intent": getattr(request, "agentpay_intent", None), "answer_status": status,
                  "answer_problem": slug, "answered_at": trusted_now(),
                  "duration_ms": _elapsed_ms(request)}
        if request.agentpay_logged and request.agentpay_answer_written == (status, slug):
            pass  # written with the row (request_log_expect), and it is the answer sent
        elif request.agentpay_logged:
            GatewayRequest.objects.filter(pk=record.pk).update(**answer)
        else:  # nothing this request did was written: its row and its answer in one INSERT
            for name, value in answer.items():
                setattr(record, name, value)
            request_log_write(request)
        log.info("request_id=%s %s %s → %s", request_id, request.method, storable(request.path)[:200],
                 response.status_code)
        return response


def request_log_write(request: HttpRequest) -> None:
    """Write the request's row now (once), with the tenant, route and intent known so far."""
    if getattr(request, "agentpay_logged", True):
        return
    record: GatewayRequest = request.agentpay_log
    for name in ("tenant", "route", "intent"):
        if getattr(request, f"agentpay_{name}", None) is not None:  # saved rows, as the answer's UPDATE sets them
            setattr(record, name, getattr(request, f"agentpay_{name}"))
    record.pk, record._state.adding = None, True  # an open rolled back may have given it an id
    record.save(force_insert=True)
    request.agentpay_logged = True


def request_log_expect(request: HttpRequest, answer: tuple[int, str]) -> None:
    """The view knows its answer (status, problem slug) before the request's row is written: the
    row is written with it (answered now), and the answer's UPDATE is left out if the response is
    that answer. Nothing once the row is written: the UPDATE then writes the answer as usual."""
    if getattr(request, "agentpay_logged", True):
        return
    record: GatewayRequest = request.agentpay_log
    record.answer_status, record.answer_problem = answer
    record.answered_at = trusted_now()
    record.duration_ms = _elapsed_ms(request)
    request.agentpay_answer_written = answer


def request_log_answer(request: HttpRequest, answer: tuple[int, str]) -> RequestAnswer | None:
    """The answer (status, problem slug) the view will send if the acceptance it is about to ask
    is accepted, for that acceptance to write into the request's row (written already, not yet
    answered), answered now; None when there is no such row. The view then calls
    `request_log_answered` with what the acceptance wrote."""
    if not getattr(request, "agentpay_logged", False) or request.agentpay_answer_written is not None:
        return None
    return RequestAnswer(request_id=request.agentpay_request_id, status=answer[0], problem=answer[1],
                         answered_at=trusted_now(),
                         duration_ms=_elapsed_ms(request))


def request_log_answered(request: HttpRequest, written: RequestAnswer | None) -> None:
    """The acceptance wrote `written` into the request's row: no UPDATE if it is the answer sent."""
    if written is not None:
        request.agentpay_answer_written = (written.status, written.problem)


def _elapsed_ms(request: HttpRequest) -> int:
    """Milliseconds since the request arrived (the middleware's `agentpay_started`)."""
    return int((time.monotonic() - request.agentpay_started) * 1000)
