"""A database with one known value for every /metrics family (used by the metrics tests and the
real-Prometheus test)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from agentpay.models import Fulfillment, PaymentIntent, PricedRoute, Settlement, Tenant
from dunning.actions.alerts import alert_raise
from dunning.models import AlertKind, EventOutcome, FactKind, JobRun, MonetaryFact, PaymentAttempt, ProviderEvent
from entitlements.models import EntitlementSnapshot
from tests.support.builders import make_subscription, open_cycle


@dataclass(frozen=True)
class Figures:
    now: datetime
    inbox_pending: int = 2
    inbox_failed: int = 1
    unknown_attempts: int = 1
    unknown_settlements: int = 1
    unknown_fulfillments: int = 2
    alerts_lag_seconds: float = 90.0
    latencies: tuple[float, ...] = (4.0, 45.0)


def _event(n: int, outcome: str, received_at: datetime) -> ProviderEvent:
    return ProviderEvent.objects.create(
        event_id=f"evt_metrics_{n}", event_type="invoice.payment_failed", account="acct_test",
        payload={"id": f"evt_metrics_{n}"}, signature_verified=True, received_at=received_at, outcome=outcome,
        processed_at=received_at if outcome == EventOutcome.APPLIED else None)


def _intent(tenant: Tenant, route: PricedRoute, n: int, settlement: str, fulfillment: str, now: datetime) -> None:
    intent = PaymentIntent.objects.create(tenant=tenant, idempotency_key=f"metrics-{n}", request_digest="0" * 64,
                                          rail="wallet", route=route, amount=150, currency="usd", created_at=now,
                                          state_changed_at=now, first_request_id=uuid.uuid4())
    Settlement.objects.create(intent=intent, rail="wallet", state=settlement, created_at=now, state_changed_at=now)
    Fulfillment.objects.create(intent=intent, state=fulfillment, state_changed_at=now)


def _snapshot(sub, generation: int, profile: str, at: datetime) -> None:
    EntitlementSnapshot.objects.create(subscription=sub, generation=generation, profile=profile, capabilities={},
                                       reason="metrics test", issued_at=at)


def _paid(cycle, at: datetime) -> None:
    MonetaryFact.objects.create(kind=FactKind.PAYMENT_SUCCEEDED, invoice=cycle.invoice, cycle=cycle,
                                amount=cycle.amount, currency=cycle.currency, provider_ref=f"pi_{cycle.pk}",
                                dedupe_key=f"metrics-paid:{cycle.pk}", occurred_at=at, recorded_at=at)


def build_figures(now: datetime) -> Figures:
    figures = Figures(now=now)
    _event(1, EventOutcome.PENDING, now - timedelta(seconds=40))
    _event(2, EventOutcome.PENDING, now - timedelta(seconds=5))
    _event(3, EventOutcome.FAILED, now - timedelta(seconds=300))
    _event(4, EventOutcome.APPLIED, now - timedelta(seconds=300))

    unknown_cycle = open_cycle(make_subscription(now=now - timedelta(days=3)), now=now - timedelta(days=2))
    PaymentAttempt.objects.create(cycle=unknown_cycle, origin="LOCAL", idempotency_key="metrics-unknown",
                                  invoice_digest="x" * 64, amount=unknown_cycle.amount, currency=unknown_cycle.currency,
                                  state="UNKNOWN", created_at=now - timedelta(hours=1))

    tenant = Tenant.objects.create(name="metrics tenant")
    route = PricedRoute.objects.create(slug="metrics", name="metrics", upstream_base_url="http://127.0.0.1:9",
                                       price_minor=150, rails_allowed=["wallet"])
    _intent(tenant, route, 1, "unknown", "unknown", now)
    _intent(tenant, route, 2, "pending", "unknown", now)
    _intent(tenant, route, 3, "captured", "succeeded", now)

    JobRun.objects.create(job="alerts", run_for=now, started_at=now - timedelta(seconds=100),
                          finished_at=now - timedelta(seconds=90), status="OK")
    JobRun.objects.create(job="alerts", run_for=now, started_at=now - timedelta(seconds=20),
                          finished_at=now - timedelta(seconds=10), status="FAILED")  # not a success

    for latency in figures.latencies:  # suspended, then paid, then FULL `latency` seconds later
        sub = make_subscription(now=now - timedelta(days=3))
        cycle = open_cycle(sub, now=now - timedelta(days=2))
        paid_at = now - timedelta(hours=2)
        _snapshot(sub, 50, "SUSPENDED", paid_at - timedelta(hours=1))
        _paid(cycle, paid_at)
        _snapshot(sub, 51, "FULL", paid_at + timedelta(seconds=latency))
    waiting = make_subscription(now=now - timedelta(days=3))  # paid, still not FULL
    waiting_cycle = open_cycle(waiting, now=now - timedelta(days=2))
    _snapshot(waiting, 50, "SUSPENDED", now - timedelta(hours=5))
    _paid(waiting_cycle, now - timedelta(hours=1))
    old = make_subscription(now=now - timedelta(days=3))  # paid before the window: left out
    old_cycle = open_cycle(old, now=now - timedelta(days=2))
    _snapshot(old, 50, "SUSPENDED", now - timedelta(days=2))
    _paid(old_cycle, now - timedelta(hours=30))
    _snapshot(old, 51, "FULL", now - timedelta(hours=29))

    alert_raise(kind=AlertKind.PAID_NOT_RESTORED, dedupe_key="paid_not_restored:in_m1", detail="d", figures={},
                now=now)
    alert_raise(kind=AlertKind.PAID_NOT_RESTORED, dedupe_key="paid_not_restored:in_m2", detail="d", figures={},
                now=now)
    return figures
