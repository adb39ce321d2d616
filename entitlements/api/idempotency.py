"""`Idempotency-Key` for the state-changing POSTs (exception, retry, policy publish).

The key is claimed per principal in its own committed transaction *before* the service runs
(the acceptance service opens a durable transaction, so nothing may wrap it). Then:

- same key, same request (method, path, canonical JSON body) → the stored response is replayed
  with ``Idempotent-Replayed: true``;
- same key, different request → 422 ``idempotency-key-reused``;
- same key while the first request is still running → 409 ``idempotency-key-in-flight``.

Only service outcomes are stored: input that fails validation or names a missing object is
answered before the claim, so fixing the input and resending with the same key works. A
request that raises or answers 5xx releases its claim. Records expire after
``API_IDEMPOTENCY_RETENTION_HOURS`` (24 h); an in-flight claim older than
``API_IDEMPOTENCY_IN_FLIGHT_SECONDS`` is taken to belong to a crashed request.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.encoders import JSONEncoder

from dunning.clock import trusted_now
from entitlements.api.auth import principal_key
from entitlements.api.problems import problem_response
from entitlements.models import IdempotencyRecord, IdempotencyState

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
_KEY_RE = re.compile(r"^[\x21-\x7e]{1,255}$")  # visible ASCII, no spaces


def request_digest(request: Request) -> str:
    body = json.dumps(request.data, sort_keys=True, separators=(",", ":"), cls=JSONEncoder)
    return hashlib.sha256(f"{request.method} {request.path}\n{body}".encode()).hexdigest()


def _retention() -> timedelta:
    return timedelta(hours=settings.API_IDEMPOTENCY_RETENTION_HOURS)


def _claim(principal: str, key: str, digest: str, now: datetime) -> IdempotencyRecord | Response:
    try:
        with transaction.atomic():
            return IdempotencyRecord.objects.create(principal=principal, key=key, request_digest=digest,
                                                    created_at=now, expires_at=now + _retention())
    except IntegrityError:
        pass
    existing = IdempotencyRecord.objects.filter(principal=principal, key=key).first()
    stale_claim = timedelta(seconds=settings.API_IDEMPOTENCY_IN_FLIGHT_SECONDS)
    if existing is None or existing.expires_at <= now or (
            existing.state == IdempotencyState.IN_FLIGHT and existing.created_at <= now - stale_claim):
        if existing is not None:  # take it over by compare-and-set, so only one repeat wins
            taken = IdempotencyRecord.objects.filter(pk=existing.pk, created_at=existing.created_at).update(
                request_digest=digest, state=IdempotencyState.IN_FLIGHT, created_at=now, completed_at=None,
                expires_at=now + _retention(), response_status=None, response_body=None, response_content_type="")
            if taken == 1:
                return IdempotencyRecord.objects.get(pk=existing.pk)
        return _in_flight()
    if existing.request_digest != digest:
        return problem_response(422, "idempotency-key-reused", "Idempotency-Key reused with a different request",
                                "This Idempotency-Key was already used with a different request body or endpoint; "
                                "use a new key for a new request.")
    if existing.state == IdempotencyState.IN_FLIGHT:
        return _in_flight()
    return Response(existing.response_body, status=existing.response_status,
                    content_type=existing.response_content_type or None, headers={REPLAYED_HEADER: "true"})


def _in_flight() -> Response:
    return problem_response(409, "idempotency-key-in-flight", "A request with this Idempotency-Key is in progress",
                            "Wait for the first request to finish, then repeat it to receive its response.")


def idempotent_call(request: Request, run: Callable[[], Response]) -> Response:
    """Run `run` at most once per (principal, Idempotency-Key) and request digest."""
    key = request.headers.get(HEADER, "")
    if not key:
        return problem_response(400, "idempotency-key-required", "Idempotency-Key header required",
                                f"Send a unique {HEADER} header (1-255 visible ASCII characters) with this request.",
                                errors=[{"field": HEADER, "message": "required, 1-255 visible ASCII characters",
                                         "code": "required"}])
    if not _KEY_RE.match(key):
        # Refused before any claim: a NUL or a 10 kB key never reaches the idempotency table.
        fault = (f"is {len(key)} characters long" if len(key) > 255
                 else "contains a character outside visible ASCII (a space, a control character such as NUL)")
        return problem_response(400, "idempotency-key-invalid", "Idempotency-Key header is not valid",
                                f"The {HEADER} header {fault}; send 1-255 visible ASCII characters.",
                                errors=[{"field": HEADER, "message": f"{fault}; 1-255 visible ASCII characters",
                                         "code": "invalid"}])
    now = trusted_now()
    claimed = _claim(principal_key(request), key, request_digest(request), now)
    if isinstance(claimed, Response):
        return claimed
    try:
        response = run()
    except BaseException:
        IdempotencyRecord.objects.filter(pk=claimed.pk, state=IdempotencyState.IN_FLIGHT).delete()
        raise
    if response.status_code >= 500:
        IdempotencyRecord.objects.filter(pk=claimed.pk, state=IdempotencyState.IN_FLIGHT).delete()
        return response
    body = json.loads(json.dumps(response.data, cls=JSONEncoder))
    IdempotencyRecord.objects.filter(pk=claimed.pk).update(
        state=IdempotencyState.DONE, response_status=response.status_code, response_body=body,
        response_content_type=response.content_type or "", completed_at=trusted_now())
    return response


def idempotency_purge_expired(*, now: datetime) -> int:
    """Delete records past their retention. Returns how many."""
    deleted, _ = IdempotencyRecord.objects.filter(expires_at__lte=now).delete()
    return deleted
