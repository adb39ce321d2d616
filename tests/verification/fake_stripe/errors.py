"""Stripe-shaped errors raised by simulator operations and rendered by the HTTP layer."""

from __future__ import annotations

from typing import Any

DOC_URL = "https://stripe.com/docs/error-codes/"


class SimError(Exception):
    """An error Stripe would answer with ``{"error": {...}}`` and an HTTP status."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None, decline_code: str | None = None,
                 extra: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.decline_code = decline_code
        self.extra = dict(extra or {})

    def error_dict(self) -> dict[str, Any]:
        error: dict[str, Any] = {
            "type": self.type, "code": self.code, "decline_code": self.decline_code,
            "message": self.message, "param": self.param,
        }
        if self.code:
            error["doc_url"] = DOC_URL + self.code.replace("_", "-")
        error.update(self.extra)
        return error

    def body(self) -> dict[str, Any]:
        return {"error": self.error_dict()}


class InvalidTransition(SimError):
    """A state change the object's current status does not allow (HTTP 400)."""

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None) -> None:
        super().__init__(400, message, code=code, param=param)


class CardDeclined(SimError):
    """HTTP 402 ``card_error``; the HTTP layer adds the rendered payment intent."""

    def __init__(self, message: str, *, code: str, decline_code: str, charge_id: str, payment_intent_id: str) -> None:
        super().__init__(402, message, type="card_error", code=code, decline_code=decline_code,
                         extra={"charge": charge_id})
        self.charge_id = charge_id
        self.payment_intent_id = payment_intent_id


def not_found(kind: str, object_id: str, param: str = "id") -> SimError:
    return SimError(404, f"No such {kind}: '{object_id}'", code="resource_missing", param=param)
