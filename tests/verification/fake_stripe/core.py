"""``SimulatorCore``: state, ledger, events, webhooks and faults in one object; `simulator.StripeSimulator`
adds the HTTP server, whose request handlers (`api`, `control`, `hosted`) act on this core."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from tests.verification.fake_stripe.aftercare import AftercareMixin
from tests.verification.fake_stripe.billing import DAY, BillingMixin
from tests.verification.fake_stripe.contract import ContractMixin
from tests.verification.fake_stripe.faults import FaultInjector
from tests.verification.fake_stripe.idempotency import IdempotencyStore
from tests.verification.fake_stripe.realism import NetworkConditions, NetworkProfile
from tests.verification.fake_stripe.rendering import DEFAULT_API_VERSION, Renderer
from tests.verification.fake_stripe.state import Store
from tests.verification.fake_stripe.webhooks import Delivery, DeliveryMixin, OutboxEntry, Sink


class SimulatorCore(BillingMixin, ContractMixin, AftercareMixin, DeliveryMixin):
    """A Stripe-compatible simulator for the API subset the product's adapter uses.

    Thread-safe: one RLock guards all state. Webhook deliveries, fault sleeps and the network
    latency of ``network`` (a `realism.NetworkProfile`) happen outside it.
    """

    def __init__(self, *, account: str = "acct_demo", webhook_secrets: Iterable[str] = ("whsec_local",),
                 webhook_api_version: str = DEFAULT_API_VERSION, sink: Sink | str | None = None,
                 auto_deliver: bool = False, default_api_version: str = DEFAULT_API_VERSION,
                 clock: Callable[[], float] | None = None, retry_schedule: Iterable[int] = (3 * DAY, 5 * DAY, 7 * DAY),
                 max_attempts: int = 4, mark_uncollectible_after_attempts: bool = False,
                 subscription_status_after_exhaustion: str = "past_due", idempotency_retention: float = 24 * 3600,
                 webhook_timeout: float = 5.0, webhook_clock: Callable[[], float] | None = None,
                 api_keys: Iterable[str] | None = None, logger: Callable[[str], None] | None = None,
                 network: NetworkProfile | None = None) -> None:
        self.lock = threading.RLock()
        self._depth = 0
        self._tls = threading.local()
        self._delivery_lock = threading.Lock()
        self.account = account
        self.webhook_secrets = list(webhook_secrets)
        self.webhook_api_version = webhook_api_version
        self.default_api_version = default_api_version
        self.sink = sink
        self.auto_deliver = auto_deliver
        self.clock: Callable[[], float] = clock or (lambda: time.time())
        self.retry_schedule = list(retry_schedule)
        self.max_attempts = max_attempts
        self.mark_uncollectible_after_attempts = mark_uncollectible_after_attempts
        self.subscription_status_after_exhaustion = subscription_status_after_exhaustion
        self.webhook_timeout = webhook_timeout
        # Signature timestamps use the simulator clock unless told otherwise (e.g. ``time.time`` when a test
        # moves only the simulator clock but the receiver checks the 300 s tolerance against real time).
        self.webhook_clock = webhook_clock
        self.api_keys = set(api_keys) if api_keys is not None else None
        self.logger = logger
        self.store = Store()
        self.renderer = Renderer(self.store, account=account)
        self.faults = FaultInjector()
        # Latency and the request-rate limit of a real provider (`realism`); off unless a profile is given.
        self.network = NetworkConditions(network)
        self.idempotency = IdempotencyStore(self.now, idempotency_retention)
        self.outbox: list[OutboxEntry] = []
        self.delivery_log: list[Delivery] = []

    # ---- clock and settings
    def now(self) -> float:
        return float(self.clock())

    def now_ts(self) -> int:
        return int(self.now())

    @property
    def idempotency_retention(self) -> float:
        return self.idempotency.retention

    @idempotency_retention.setter
    def idempotency_retention(self, seconds: float) -> None:
        self.idempotency.retention = seconds

    def log(self, message: str) -> None:
        if self.logger is not None:
            self.logger(message)

    # ---- events
    def _emit(self, event_type: str, obj: dict[str, Any], previous: dict[str, Any] | None = None) -> dict[str, Any]:
        request = getattr(self._tls, "request", None) or {"id": None, "idempotency_key": None}
        data: dict[str, Any] = {"object": self.renderer.render(obj, self.webhook_api_version)}
        if previous is not None:
            data["previous_attributes"] = copy.deepcopy(previous)
        event = {
            "id": self.store.new_id("event"), "object": "event", "account": self.account,
            "api_version": self.webhook_api_version, "created": self.now_ts(), "data": data, "livemode": False,
            "pending_webhooks": 1 if self.sink is not None else 0, "request": dict(request), "type": event_type,
        }
        self.store.events.append(event)
        self.store.events_by_id[event["id"]] = event
        self._queue(event)
        self.log(f"event {event_type} {event['id']} ({obj['id']})")
        return event

    @property
    def events(self) -> list[dict[str, Any]]:
        """All events in creation order (oldest first)."""
        with self.lock:
            return copy.deepcopy(self.store.events)

    def events_of_type(self, *types: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] in types]

    # ---- ledger (the monetary truth)
    @property
    def ledger(self) -> list[dict[str, Any]]:
        with self.lock:
            return copy.deepcopy(self.store.ledger)

    def successful_charges(self, invoice_id: str) -> list[dict[str, Any]]:
        return [e for e in self.ledger if e["invoice"] == invoice_id]

    def total_charged(self, invoice_id: str) -> int:
        """Gross amount successfully charged for the invoice (refunds not deducted)."""
        return sum(e["amount"] for e in self.successful_charges(invoice_id))

    def net_charged(self, invoice_id: str) -> int:
        """Charged minus refunded minus lost disputes."""
        return sum(e["amount"] - e["refunded"] - (e["amount"] if e["dispute_status"] == "lost" else 0)
                   for e in self.successful_charges(invoice_id))

    def charges_for_key(self, idempotency_key: str) -> list[dict[str, Any]]:
        return [e for e in self.ledger if e["idempotency_key"] == idempotency_key]

    # ---- reading objects
    def get(self, object_id: str) -> dict[str, Any] | None:
        """The internal (version-neutral) form of an object, as a copy."""
        with self.lock:
            obj = self.store.get(object_id)
            return copy.deepcopy(obj) if obj is not None else None

    def retrieve(self, object_id: str, *, api_version: str | None = None, expand: Iterable[str] = ()) -> dict[str, Any]:
        """The object as the API would render it for ``api_version``."""
        with self.lock:
            obj = self.store.get(object_id)
            if obj is None:
                raise KeyError(object_id)
            return self.renderer.render(obj, api_version or self.default_api_version, expand)

    def history(self, object_id: str) -> list[dict[str, Any]]:
        with self.lock:
            return self.store.history(object_id)

    def invoices(self, subscription_id: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            return [copy.deepcopy(i) for i in self.store.all_of("invoice")
                    if subscription_id is None or i["subscription"] == subscription_id]
