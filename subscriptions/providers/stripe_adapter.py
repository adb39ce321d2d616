"""Stripe behind the provider interface, through the official SDK: the calls, their errors (and
429 back-off), webhook verification and answers. What Stripe's JSON means is read by
`stripe_shapes`."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, TypeVar
from urllib.parse import quote_plus

import stripe

from subscriptions.providers.base import (
    EventSubject,
    NotificationAnswer,
    PayOutcome,
    ProviderCustomer,
    ProviderDeclined,
    ProviderDispute,
    ProviderError,
    ProviderIndeterminate,
    ProviderInvoice,
    ProviderNotFound,
    ProviderPayment,
    ProviderPrice,
    ProviderRequestError,
    ProviderSubscription,
    WebhookVerificationError,
)
from subscriptions.providers.pacing import RequestPacer
from subscriptions.providers.stripe_http import stripe_http_client
from subscriptions.providers.stripe_shapes import (
    PAID_EVENT_TYPES,
    expandable_id,
    is_legacy_api_version,
    parse_invoice,
    parse_payment,
    parse_subscription,
    stripe_event_subject,
)

DEFAULT_TOLERANCE_SECONDS = 300
SIGNATURE_HEADER = "stripe-signature"
# What a refused delivery's problem document is titled, by refusal code.
REFUSAL_TITLES = {
    "BODY_TOO_LARGE": "Webhook body too large",
    "MALFORMED_EVENT": "Not a provider event",
    "MALFORMED_PAYLOAD": "Webhook payload is not a JSON event",
    "TIMESTAMP_TOO_OLD": "Webhook signature too old",
    "TIMESTAMP_IN_FUTURE": "Webhook signature from the future",
}
PROBLEM_BASE = "https://dunning.invalid/problems/"
# Back-off after a 429 that names no Retry-After: BASE, 2 × BASE, ... up to CAP seconds, each with
# equal jitter (between half and all of it), all within the adapter's rate-limit budget.
RATE_LIMIT_BACKOFF_BASE = 0.25
RATE_LIMIT_BACKOFF_CAP = 2.0
DEFAULT_RATE_LIMIT_RETRY_SECONDS = 5.0
T = TypeVar("T")


class StripeProvider:
    name = "stripe"
    label = "Stripe"
    webhook_headers = frozenset({SIGNATURE_HEADER, "content-type", "content-length", "user-agent", "x-forwarded-for"})
    # Stripe keeps idempotency keys for 24 hours.
    idempotency_retention = timedelta(hours=24)
    lists_events = True
    paid_event_types = PAID_EVENT_TYPES

    def __init__(self, *, api_key: str, api_base: str, webhook_secrets: Iterable[str], account: str = "",
                 timeout: float = 10.0, api_version: str | None = None,
                 rate_limit_retry_seconds: float = DEFAULT_RATE_LIMIT_RETRY_SECONDS,
                 rate_limit_backoff: tuple[float, float] = (RATE_LIMIT_BACKOFF_BASE, RATE_LIMIT_BACKOFF_CAP),
                 max_requests_per_second: float = 0.0) -> None:
        self.account = account
        # How long one call may keep trying through HTTP 429s (settings.STRIPE_RATE_LIMIT_RETRY_SECONDS).
        self.rate_limit_retry_seconds = max(0.0, float(rate_limit_retry_seconds))
        self.rate_limit_backoff = rate_limit_backoff
        self._jitter = random.Random()
        # Shared by this process's threads (settings.STRIPE_MAX_REQUESTS_PER_SECOND; 0: unpaced).
        self.pacer = RequestPacer(max_requests_per_second)
        self.api_version = api_version
        self.webhook_secrets = [s for s in webhook_secrets if s]
        self._client = stripe.StripeClient(
            api_key, stripe_version=api_version, base_addresses={"api": api_base}, max_network_retries=0,
            http_client=stripe_http_client(api_base=api_base, timeout=timeout),
        )

    @property
    def legacy(self) -> bool:
        return is_legacy_api_version(self.api_version)

    # ---- reads
    def fetch_invoice(self, invoice_id: str) -> ProviderInvoice:
        """The one read every paid event makes: the same GET as ``v1.invoices.retrieve``, through the
        SDK's requestor and its errors, without building the StripeObject tree `_plain` then threw away
        for the response's JSON: 5.1-5.8 -> 3.1-3.4 ms of CPU per fetch."""
        params = {} if self.legacy else {"expand": ["payments"]}
        raw = self._call(lambda: self._client.raw_request("get", f"/v1/invoices/{quote_plus(invoice_id)}", **params))
        return parse_invoice(raw, account=self.account)

    def fetch_payment(self, payment_id: str) -> ProviderPayment:
        if payment_id.startswith("ch_") or payment_id.startswith("py_"):
            raw = self._call(lambda: self._client.v1.charges.retrieve(payment_id))
        else:
            raw = self._call(lambda: self._client.v1.payment_intents.retrieve(payment_id))
        return parse_payment(raw)

    def fetch_dispute(self, dispute_id: str) -> ProviderDispute:
        raw = self._call(lambda: self._client.v1.disputes.retrieve(dispute_id))
        ref = expandable_id(raw.get("payment_intent")) or expandable_id(raw.get("charge")) or ""
        return ProviderDispute(id=raw["id"], status=raw.get("status", ""), amount=int(raw.get("amount") or 0),
                               currency=(raw.get("currency") or "").lower(), payment_ref=ref, raw=raw)

    def fetch_subscription(self, subscription_id: str) -> ProviderSubscription:
        raw = self._call(lambda: self._client.v1.subscriptions.retrieve(
            subscription_id, params={"expand": ["customer"]}))
        return parse_subscription(raw, account=self.account)

    def invoice_for_payment(self, payment_id: str) -> str | None:
        """Which invoice a payment intent or charge paid. Legacy payments name it; since 2025-03-31
        the link lives on InvoicePayment objects."""
        payment = self.fetch_payment(payment_id)
        if payment.invoice_id or self.legacy:
            return payment.invoice_id
        kind = "charge" if payment.object == "charge" else "payment_intent"
        page = self._call(lambda: self._client.v1.invoice_payments.list(
            params={"payment": {"type": kind, kind: payment_id}, "limit": 1}))
        data = page.get("data") or []
        return expandable_id(data[0].get("invoice")) if data else None

    def fetch_customer(self, customer_id: str) -> ProviderCustomer:
        """Invoices are charged to ``invoice_settings.default_payment_method``, else to the legacy
        ``default_source`` (a card or source attached before PaymentMethods). A deleted customer
        has neither."""
        raw = self._call(lambda: self._client.v1.customers.retrieve(customer_id))
        settings = raw.get("invoice_settings") or {}
        method = expandable_id(settings.get("default_payment_method")) or expandable_id(raw.get("default_source"))
        return ProviderCustomer(id=raw["id"], account=self.account, email=raw.get("email") or "",
                                default_payment_method=method or None, raw=raw)

    def payment_method_of(self, payment: ProviderPayment) -> str | None:
        """A payment intent names the method of its last attempt (``payment_method``, or the one in
        ``last_payment_error`` once Stripe has detached it after a failure); a charge names its own."""
        raw = payment.raw
        error = raw.get("last_payment_error") or {}
        method = (expandable_id(raw.get("payment_method")) or expandable_id(error.get("payment_method"))
                  or expandable_id(raw.get("source")))
        return method or None

    def fetch_price(self, price_id: str) -> ProviderPrice:
        raw = self._call(lambda: self._client.v1.prices.retrieve(price_id, params={"expand": ["product"]}))
        product = raw.get("product")
        name = (product.get("name") if isinstance(product, dict) else "") or raw.get("nickname") or ""
        recurring = raw.get("recurring") or {}
        return ProviderPrice(id=raw["id"], product_name=str(name), interval=recurring.get("interval") or "", raw=raw)

    def list_events(self, *, created_after: datetime | None = None, limit: int = 100) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit}
        if created_after is not None:
            params["created"] = {"gt": int(created_after.timestamp())}
        page = self._call(lambda: self._client.v1.events.list(params=params))
        return list(page.get("data", []))

    def list_events_since(self, *, created_after: datetime, max_events: int = 10_000) -> list[dict[str, Any]]:
        """Every event created after `created_after`, newest first, paging with `starting_after`
        up to `max_events` (the caller sees truncation as len(result) == max_events)."""
        events: list[dict[str, Any]] = []
        params: dict[str, Any] = {"limit": 100, "created": {"gt": int(created_after.timestamp())}}
        while len(events) < max_events:
            page = self._call(lambda p=dict(params): self._client.v1.events.list(params=p))
            data = list(page.get("data", []))
            events.extend(data[: max_events - len(events)])
            if not data or not page.get("has_more"):
                break
            params["starting_after"] = data[-1]["id"]
        return events

    # ---- writes
    def cancel_subscription(self, subscription_id: str, *, idempotency_key: str) -> ProviderSubscription:
        """Cancel at once (``DELETE /v1/subscriptions/{id}``) and return the subscription as Stripe now
        holds it. Stripe answers a second cancel with a 4xx ("No such subscription" for one already
        canceled); then the subscription is read back, and when it is canceled that is the answer.
        The key is sent, though Stripe does not replay DELETE requests by it (a DELETE is meant to
        be idempotent by itself)."""
        if not idempotency_key:
            raise ValueError("cancelling a subscription needs an idempotency key")
        try:
            raw = self._call(lambda: self._client.v1.subscriptions.cancel(
                subscription_id, params={"expand": ["customer"]}, options={"idempotency_key": idempotency_key}))
        except (ProviderNotFound, ProviderRequestError) as refused:
            try:
                current = self.fetch_subscription(subscription_id)
            except ProviderNotFound:
                raise refused from None
            if current.status == "canceled":
                return current
            raise
        return parse_subscription(raw, account=self.account)

    def pay_invoice(self, invoice_id: str, *, idempotency_key: str) -> PayOutcome:
        if not idempotency_key:
            raise ValueError("paying an invoice needs an idempotency key")
        params = {} if self.legacy else {"expand": ["payments"]}
        raw = self._call(lambda: self._client.v1.invoices.pay(
            invoice_id, params=params, options={"idempotency_key": idempotency_key}))
        invoice = parse_invoice(raw, account=self.account)
        ref = invoice.payment_refs[-1] if invoice.payment_refs else ""
        if invoice.status != "paid":
            self._raise_for_unpaid(invoice, ref)
        return PayOutcome(invoice=invoice, payment_ref=ref)

    def _raise_for_unpaid(self, invoice: ProviderInvoice, ref: str) -> None:
        """A 200 from pay whose invoice is not paid is not a payment: name what it is instead."""
        payment = self.fetch_payment(ref) if ref else None
        if payment is not None and payment.status == "processing":
            raise ProviderIndeterminate(f"payment {ref} is still processing")
        if payment is not None and payment.status == "requires_action":
            raise ProviderDeclined("payment needs customer authentication", decline_code="authentication_required",
                                   payment_ref=ref, raw=invoice.raw)
        code = (payment.decline_code if payment else "") or invoice.last_decline_code or "card_declined"
        raise ProviderDeclined(f"invoice {invoice.id} is {invoice.status} after paying", decline_code=code,
                               payment_ref=ref, raw=invoice.raw)

    # ---- webhooks
    def verify_notification(self, *, payload: bytes, headers: Mapping[str, str], now: datetime) -> dict[str, Any]:
        signature = next((v for k, v in headers.items() if k.lower() == SIGNATURE_HEADER), "")
        return self.verify_webhook(payload=payload, signature_header=signature, now=now)

    def notification_problem(self, event: dict[str, Any]) -> tuple[str, str] | None:
        return None  # Stripe's checks (account, amounts) need fetched objects: processing makes them

    def event_subject(self, event_type: str, payload: dict[str, Any]) -> EventSubject:
        return stripe_event_subject(event_type, payload)

    def answer_notification(self, *, status: int, code: str, detail: str, body: dict[str, Any]) -> NotificationAnswer:
        if status == 200:
            return NotificationAnswer(200, "application/json", json.dumps(body).encode())
        # An RFC 9457 problem document, as every client-facing error of the product.
        problem = {"type": PROBLEM_BASE + f"webhook-{code}".lower().replace("_", "-"),
                   "title": REFUSAL_TITLES.get(code, "Webhook signature verification failed"), "status": status,
                   **({"detail": detail} if detail else {}), "code": code}
        return NotificationAnswer(status, "application/problem+json", json.dumps(problem).encode())

    def verify_webhook(self, *, payload: bytes, signature_header: str, now: datetime) -> dict[str, Any]:
        if not signature_header:
            raise WebhookVerificationError("missing Stripe-Signature header", code="SIGNATURE_MISSING")
        if not self.webhook_secrets:
            raise WebhookVerificationError("no webhook secret configured", code="NO_SECRET_CONFIGURED")
        timestamp = _header_timestamp(signature_header)
        if timestamp - now.timestamp() > DEFAULT_TOLERANCE_SECONDS:
            raise WebhookVerificationError("signature timestamp is more than 300 s in the future",
                                           code="TIMESTAMP_IN_FUTURE")
        if now.timestamp() - timestamp > DEFAULT_TOLERANCE_SECONDS:
            raise WebhookVerificationError("signature timestamp is more than 300 s old", code="TIMESTAMP_TOO_OLD")
        if not any(part.strip().startswith("v1=") for part in signature_header.split(",")):
            raise WebhookVerificationError("no v1 signature in Stripe-Signature", code="NO_V1_SIGNATURE")
        try:
            text = payload.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise WebhookVerificationError("payload is not UTF-8", code="MALFORMED_PAYLOAD") from exc
        last_error: Exception | None = None
        for secret in self.webhook_secrets:  # several secrets while one is being rolled
            try:
                # The SDK's own check, construct_event's first half. Its second half builds an Event of
                # StripeObjects nobody reads (three quarters of construct_event's time), after which the
                # body was parsed again into plain JSON: it is parsed once, below.
                stripe.WebhookSignature.verify_header(text, signature_header, secret,
                                                      tolerance=DEFAULT_TOLERANCE_SECONDS)
                break
            except stripe.SignatureVerificationError as exc:
                last_error = exc
        else:
            raise WebhookVerificationError(str(last_error) if last_error else "signature did not verify",
                                           code="SIGNATURE_MISMATCH")
        try:
            event = json.loads(text)  # plain JSON types, exactly as signed
        except ValueError as exc:
            raise WebhookVerificationError(f"payload is not a JSON event: {exc}", code="MALFORMED_PAYLOAD") from exc
        if not isinstance(event, dict):
            raise WebhookVerificationError("payload is JSON but not an object", code="MALFORMED_PAYLOAD")
        return event

    # ---- errors
    def _call(self, fn: Callable[[], Any]) -> dict[str, Any]:
        """One API request, with Stripe's errors in the product's words. An HTTP 429 is tried again.

        Stripe answers 429 from its limiter before it looks at the request, so nothing was done: asking
        again is safe for a read, and for a write too as long as it is the same request under the same
        idempotency key — which it is, ``fn`` is re-run as it was built (pay sends its key each time; a
        DELETE that was refused never ran, and a cancel that did run is answered by cancel's own check).
        The wait is Stripe's ``Retry-After`` when it sends one (it normally does not), else exponential
        back-off with jitter from ``rate_limit_backoff``; the tries stop before the total would pass
        ``rate_limit_retry_seconds``, and then the call is indeterminate with a message saying it was
        rate-limited, how many tries and how long: the event stays pending with it as its ``error``,
        a job run notes it.

        Why this loop and not the SDK's ``max_network_retries``: the SDK does not retry a rate-limit 429
        at all (only when Stripe sends ``Stripe-Should-Retry: true``, as for lock timeouts; by design, the
        caller is meant to back off), switching it on would also retry 409s, 5xx and dropped connections,
        writes included, which the product deliberately records as indeterminate and resolves itself, and
        it has neither a time budget nor a record of what it tried."""
        started = time.monotonic()
        tries = 0
        paced = 0.0  # time spent waiting for our own pacer's slot is not the provider's refusal
        while True:
            tries += 1
            paced += self.pacer.wait()
            try:
                return self._call_once(fn)
            except stripe.RateLimitError as exc:
                elapsed = time.monotonic() - started - paced
                asked = _retry_after(exc)
                wait = asked if asked is not None else self._backoff(tries)
                if elapsed + wait > self.rate_limit_retry_seconds:
                    raise ProviderIndeterminate(
                        _rate_limit_message(exc, tries, elapsed, self.rate_limit_retry_seconds, asked)) from exc
                time.sleep(wait)

    def _backoff(self, tries: int) -> float:
        base, cap = self.rate_limit_backoff
        delay = min(cap, base * 2 ** (tries - 1))
        return delay * (0.5 + self._jitter.random() / 2)

    def _call_once(self, fn: Callable[[], Any]) -> dict[str, Any]:
        try:
            return _plain(fn())
        except stripe.CardError as exc:
            error = (exc.json_body or {}).get("error", {})
            payment = error.get("payment_intent") or error.get("charge") or ""
            raise ProviderDeclined(
                exc.user_message or str(exc), decline_code=error.get("decline_code") or exc.code or "card_declined",
                payment_ref=expandable_id(payment) or "", raw=error,
            ) from exc
        except stripe.APIConnectionError as exc:
            raise ProviderIndeterminate(f"no answer from Stripe: {exc.user_message or exc}") from exc
        except stripe.IdempotencyError as exc:
            if exc.http_status == 409:
                raise ProviderIndeterminate("the same idempotency key is being processed") from exc
            raise ProviderRequestError(f"idempotency key misuse: {exc.user_message or exc}") from exc
        except stripe.RateLimitError:
            raise  # tried again by `_call`
        except stripe.InvalidRequestError as exc:
            if exc.http_status == 404:
                raise ProviderNotFound(exc.user_message or str(exc)) from exc
            raise ProviderRequestError(exc.user_message or str(exc)) from exc
        except stripe.StripeError as exc:
            if exc.http_status == 409:  # the same idempotency key is still in flight
                raise ProviderIndeterminate("the same idempotency key is being processed") from exc
            if exc.http_status == 404:
                raise ProviderNotFound(exc.user_message or str(exc)) from exc
            if exc.http_status is None or exc.http_status >= 500:
                raise ProviderIndeterminate(f"Stripe error {exc.http_status}: {exc.user_message or exc}") from exc
            raise ProviderError(exc.user_message or str(exc)) from exc


def _header(exc: stripe.StripeError, name: str) -> str | None:
    return next((str(v) for k, v in (exc.headers or {}).items() if k.lower() == name), None)


def _retry_after(exc: stripe.StripeError) -> float | None:
    """Seconds from a ``Retry-After: <seconds>`` header, if Stripe sent one (an HTTP date is ignored)."""
    value = _header(exc, "retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def _rate_limit_message(exc: stripe.StripeError, tries: int, elapsed: float, budget: float,
                        asked: float | None) -> str:
    reason = _header(exc, "stripe-rate-limited-reason")
    what = f"HTTP {exc.http_status or 429} {exc.code or 'rate_limit'}" + (f", {reason}" if reason else "")
    message = (f"Stripe rate-limited the request ({what}): {tries} {'try' if tries == 1 else 'tries'} "
               f"in {elapsed:.2f} s, given up within the {budget:g} s rate-limit budget")
    if asked is not None:
        message += f" (Stripe asked to wait {asked:g} s more)"
    return message


def _plain(obj: Any) -> dict[str, Any]:
    """The response as the provider sent it (the SDK's objects carry Decimals for some numbers)."""
    if isinstance(obj, stripe.StripeResponse):  # raw_request's answer
        return json.loads(obj.body)
    response = getattr(obj, "last_response", None)
    body = getattr(response, "body", None)
    if body:
        return json.loads(body)
    return json.loads(json.dumps(obj.to_dict(), default=str))


def _header_timestamp(header: str) -> int:
    for part in header.split(","):
        key, _, value = part.strip().partition("=")
        if key == "t":
            try:
                return int(value)
            except ValueError:
                break
    raise WebhookVerificationError("Stripe-Signature has no valid timestamp", code="SIGNATURE_MALFORMED")
