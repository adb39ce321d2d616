"""The payment-provider interface (SPEC §8): everything the product asks of a provider.

Adapters return normalised objects plus the raw body (the raw body becomes the receipt).
Errors are typed by what they mean for money: a *definite* refusal (`ProviderDeclined`,
`ProviderNotFound`, `ProviderRequestError`) versus an *indeterminate* outcome
(`ProviderIndeterminate`: timeout, connection loss, 5xx) after which a write may or may not
have happened and must be resolved by querying, never by a new attempt.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol


class ProviderError(Exception):
    """Base of every provider failure."""


class ProviderIndeterminate(ProviderError):
    """Timeout, connection error or 5xx: the operation may or may not have taken effect."""


class ProviderNotFound(ProviderError):
    """The provider has no such object (definite)."""


class ProviderRequestError(ProviderError):
    """The provider refused the request itself (4xx other than a card decline), e.g. an
    idempotency key reused with different parameters."""


class ProviderDeclined(ProviderError):
    """A definite payment failure with the provider's decline code."""

    def __init__(self, message: str, *, decline_code: str, payment_ref: str = "", raw: dict | None = None):
        super().__init__(message)
        self.decline_code = decline_code
        self.payment_ref = payment_ref
        self.raw = raw or {}


class WebhookVerificationError(ProviderError):
    """Signature, timestamp or payload of a webhook failed verification; `code` says which."""

    def __init__(self, message: str, *, code: str = "SIGNATURE_INVALID") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class ProviderInvoice:
    id: str
    account: str
    subscription_id: str | None
    customer_id: str | None
    status: str  # draft | open | paid | void | uncollectible
    amount_due: int  # minor units
    amount_paid: int
    currency: str  # lower-case ISO 4217
    attempt_count: int
    next_payment_attempt: datetime | None
    payment_refs: tuple[str, ...]  # payment intent / charge ids linked to the invoice, newest last
    price_ids: tuple[str, ...]  # price (or legacy plan) ids of the invoice lines
    billing_reason: str = ""
    period_start: datetime | None = None
    period_end: datetime | None = None
    hosted_invoice_url: str = ""
    last_decline_code: str = ""  # from the last payment error, when the provider shows one
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class ProviderPayment:
    """A payment intent or charge."""

    id: str
    object: str  # payment_intent | charge
    status: str  # succeeded | failed | requires_payment_method | processing | canceled | ...
    amount: int
    amount_refunded: int
    currency: str
    invoice_id: str | None
    decline_code: str
    disputed: bool
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class ProviderDispute:
    id: str
    status: str  # warning_needs_response | needs_response | under_review | won | lost | ...
    amount: int
    currency: str
    payment_ref: str  # charge or payment intent id
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


CONTRACT_STATUSES = frozenset({"trialing", "active", "past_due", "unpaid", "paused", "canceled", "incomplete",
                               "incomplete_expired"})


@dataclass(frozen=True)
class ProviderSubscription:
    """The contract as the provider holds it (seed 002's Contract/Subscription line)."""

    id: str
    account: str
    customer_id: str
    customer_email: str
    status: str  # one of CONTRACT_STATUSES (anything else is quarantined by the caller)
    price_ids: tuple[str, ...]
    interval: str  # month | year
    cancel_at_period_end: bool = False
    current_period_start: datetime | None = None
    current_period_end: datetime | None = None
    canceled_at: datetime | None = None
    ended_at: datetime | None = None
    trial_end: datetime | None = None
    # pause_collection (status stays active) or status "paused": collection is paused until resumes_at.
    pause_behavior: str = ""  # "" when not paused; keep_as_draft | mark_uncollectible | void
    pause_resumes_at: datetime | None = None
    provider: str = "stripe"  # the adapter that read it (PaymentProvider.name)
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class ProviderCustomer:
    """A customer as the provider holds it: what matters here is the payment method the
    provider charges its invoices to (a new one is what a hard decline asks the customer for)."""

    id: str
    account: str
    email: str
    default_payment_method: str | None  # id of the method invoices are charged to; None when there is none
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class ProviderPrice:
    """A price (a legacy plan id counts) with the name customers know its product by."""

    id: str
    product_name: str  # the product's name, else the price's nickname; "" when the provider names neither
    interval: str  # month | year | "" for a one-off price
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class PayOutcome:
    """Definite result of paying an invoice (an indeterminate one raises)."""

    invoice: ProviderInvoice
    payment_ref: str


class EventKind:
    """What a stored provider event is about, in the product's own words (each adapter maps its
    own event vocabulary onto these)."""

    SUBSCRIPTION = "subscription"  # the contract (a Stripe subscription, an Alipay agreement)
    INVOICE = "invoice"  # an invoice or renewal order: fetch it and reconcile its cycle
    PAYMENT = "payment"  # a payment or charge: find its invoice, then as INVOICE
    DISPUTE = "dispute"
    PAYMENT_METHOD = "payment_method"  # the customer's payment method may have changed
    IGNORED = "ignored"


@dataclass(frozen=True)
class EventSubject:
    """An adapter's reading of one stored event: which object to fetch, and what the event claims
    (a claim is never evidence; it only says when a fresh read must be older than the event)."""

    kind: str  # an EventKind
    object_id: str = ""
    payment_refs: tuple[str, ...] = ()  # PAYMENT: every id that names the payment (intent, charge)
    says_paid: bool = False  # the event says its invoice was paid
    says_payment_failed: bool = False  # the event says this payment failed
    says_refunded: bool = False  # the event says this payment was refunded
    detail: str = ""  # IGNORED: why


@dataclass(frozen=True)
class NotificationAnswer:
    """What the provider is told about one delivery, in the form it expects (Stripe: JSON and a
    status code; Alipay: the plain-text word `success`, anything else is a failure)."""

    status: int
    content_type: str
    body: bytes


class PaymentProvider(Protocol):
    name: str
    label: str  # how people call it ("Stripe", "Alipay")
    account: str  # the merchant account this adapter serves; events and objects of another are quarantined
    webhook_headers: frozenset[str]  # request headers kept with every delivery (lower case)
    idempotency_retention: timedelta  # how long a resend under the same key is answered from the provider's record
    lists_events: bool  # the provider can list past events (the missed-event reconciliation asks it)
    paid_event_types: frozenset[str]  # stored event types that say an invoice was paid (the paid -> FULL alert)

    def verify_notification(self, *, payload: bytes, headers: Mapping[str, str], now: datetime) -> dict[str, Any]:
        """Verify one raw delivery and return it as the stored event: a dict with `id`, `type`,
        `data.object` (with the object's `id`), and `account` / `created` when known. Raises
        WebhookVerificationError, whose code says what failed."""
        ...

    def notification_problem(self, event: dict[str, Any]) -> tuple[str, str] | None:
        """(code, detail) when a verified event must be quarantined at the door (the merchant,
        order, amount or currency does not match what we sent); None when it may be processed."""
        ...

    def event_subject(self, event_type: str, payload: dict[str, Any]) -> EventSubject:
        """What a stored event is about. Pure: reads the stored payload, asks nothing."""
        ...

    def answer_notification(self, *, status: int, code: str, detail: str, body: dict[str, Any]) -> NotificationAnswer:
        """The answer to a delivery: `status` 200 when it is stored (`body` says what), else the
        refusal's status, code and detail."""
        ...

    def fetch_invoice(self, invoice_id: str) -> ProviderInvoice: ...

    def fetch_payment(self, payment_id: str) -> ProviderPayment: ...

    def fetch_dispute(self, dispute_id: str) -> ProviderDispute: ...

    def fetch_subscription(self, subscription_id: str) -> ProviderSubscription: ...

    def invoice_for_payment(self, payment_id: str) -> str | None: ...

    def fetch_customer(self, customer_id: str) -> ProviderCustomer:
        """The customer now, with its default payment method. Raises ProviderNotFound,
        ProviderIndeterminate."""
        ...

    def payment_method_of(self, payment: ProviderPayment) -> str | None:
        """The payment method a fetched payment was (last) attempted with; None when it names none."""
        ...

    def fetch_price(self, price_id: str) -> ProviderPrice:
        """The price with its product's name (what customers see instead of a price id)."""
        ...

    def cancel_subscription(self, subscription_id: str, *, idempotency_key: str) -> ProviderSubscription:
        """Cancel the provider subscription at once and return it as the provider now holds it.
        Cancelling one that is already canceled returns it (idempotent). Raises
        ProviderIndeterminate (unknown: ask again by fetching), ProviderNotFound, ProviderRequestError."""
        ...

    def pay_invoice(self, invoice_id: str, *, idempotency_key: str) -> PayOutcome:
        """Charge the invoice's default payment method under `idempotency_key`.
        Raises ProviderDeclined (definite failure) or ProviderIndeterminate (unknown)."""
        ...

    def list_events(self, *, created_after: datetime | None = None, limit: int = 100) -> list[dict[str, Any]]: ...

    def list_events_since(self, *, created_after: datetime, max_events: int = 10_000) -> list[dict[str, Any]]:
        """All events after `created_after` (paged), at most `max_events`."""
        ...

    def verify_webhook(self, *, payload: bytes, signature_header: str, now: datetime) -> dict[str, Any]:
        """Return the parsed event or raise WebhookVerificationError."""
        ...
