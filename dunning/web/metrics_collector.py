"""The figures `/metrics` exports, read from the database at scrape time (issue 19 item 2).

Nothing is counted in process memory: every scrape asks PostgreSQL, so any web process answers
the same and a restart loses nothing. Each family is computed on its own; one that fails is
left out and `dunning_metrics_section_ok{section=…}` says 0 (the scrape never fails with a 500).

Families (names and meanings are listed in docs/alerting.md):

- gates: `dunning_gate_passed`, `dunning_gate_value`, `dunning_gate_sample_size`,
  `dunning_gate_offending` per gate of `dunning.gates.gates_evaluate`, `dunning_gates_passed`.
- jobs: `dunning_job_lag_seconds` = now − the end of the job's last OK JobRun (+Inf when it never
  ran OK), `dunning_job_last_success_timestamp_seconds`.
- inbox: `dunning_inbox_pending_events`, `dunning_inbox_failed_events`,
  `dunning_inbox_oldest_pending_age_seconds`.
- unknown payments: `dunning_unknown_payments_open{source=dunning_attempt|agentpay_settlement|
  agentpay_fulfillment}`.
- alerts: `dunning_alerts{kind, state=open_unowned|open_owned|resolved}`,
  `dunning_alert_deliveries{channel, status}`.
- `dunning_paid_to_full_latency_seconds` histogram, see `_paid_to_full`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Count, Exists, Max, Min, OuterRef, Q, Subquery
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from agentpay.models import Fulfillment, Settlement
from dunning.clock import trusted_now
from dunning.gates import gates_evaluate
from dunning.jobs.framework import JOBS
from dunning.models import (
    Alert,
    AlertChannel,
    AlertDelivery,
    AlertDeliveryStatus,
    AlertKind,
    EventOutcome,
    FactKind,
    JobRun,
    MonetaryFact,
    PaymentAttempt,
    ProviderEvent,
)
from dunning.states import AttemptState
from entitlements.models import EntitlementSnapshot
from entitlements.profiles import FULL

log = logging.getLogger(__name__)
LATENCY_BUCKETS = (1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 21600, 86400)
ALERT_STATES = ("open_unowned", "open_owned", "resolved")


def _gates(now: datetime) -> Iterator[Metric]:
    report = gates_evaluate(now=now)
    passed = GaugeMetricFamily("dunning_gate_passed", "1 when the release gate passes (SPEC §15), else 0",
                               labels=["gate"])
    value = GaugeMetricFamily("dunning_gate_value", "The gate's figure (NaN when it has none, e.g. no sample)",
                              labels=["gate", "unit"])
    sample = GaugeMetricFamily("dunning_gate_sample_size", "Rows the gate checked", labels=["gate"])
    offending = GaugeMetricFamily("dunning_gate_offending", "Rows that fail the gate", labels=["gate"])
    for gate in report.gates:
        passed.add_metric([gate.key], 1 if gate.passed else 0)
        value.add_metric([gate.key, gate.unit], math.nan if gate.figure is None else float(gate.figure))
        sample.add_metric([gate.key], gate.sample_size)
        offending.add_metric([gate.key], gate.offending)
    yield from (passed, value, sample, offending)
    yield GaugeMetricFamily("dunning_gates_passed", "1 when every release gate passes", value=1 if report.passed else 0)


def _jobs(now: datetime) -> Iterator[Metric]:
    last_ok = dict(JobRun.objects.filter(status="OK", finished_at__isnull=False).order_by()
                   .values("job").annotate(last=Max("finished_at")).values_list("job", "last"))
    lag = GaugeMetricFamily("dunning_job_lag_seconds", "now − the end of the job's last OK run (+Inf: never ran OK)",
                            labels=["job"])
    last = GaugeMetricFamily("dunning_job_last_success_timestamp_seconds", "End of the job's last OK run (unix time)",
                             labels=["job"])
    for job in sorted(set(JOBS) | set(last_ok)):
        finished = last_ok.get(job)
        lag.add_metric([job], math.inf if finished is None else max((now - finished).total_seconds(), 0.0))
        if finished is not None:
            last.add_metric([job], finished.timestamp())
    yield from (lag, last)


def _inbox(now: datetime) -> Iterator[Metric]:
    waiting = ProviderEvent.objects.filter(processed_at__isnull=True)
    counts = waiting.filter(outcome__in=(EventOutcome.PENDING, EventOutcome.FAILED)).aggregate(
        pending=Count("pk", filter=Q(outcome=EventOutcome.PENDING)),
        failed=Count("pk", filter=Q(outcome=EventOutcome.FAILED)),
        oldest=Min("received_at", filter=Q(outcome=EventOutcome.PENDING)))
    yield GaugeMetricFamily("dunning_inbox_pending_events", "Provider events stored but not processed yet",
                            value=counts["pending"])
    yield GaugeMetricFamily("dunning_inbox_failed_events", "Provider events whose processing failed, awaiting a retry",
                            value=counts["failed"])
    oldest = counts["oldest"]
    yield GaugeMetricFamily("dunning_inbox_oldest_pending_age_seconds", "Age of the oldest pending event (0: none)",
                            value=0.0 if oldest is None else max((now - oldest).total_seconds(), 0.0))


def _unknown_payments(now: datetime) -> Iterator[Metric]:
    family = GaugeMetricFamily("dunning_unknown_payments_open",
                               "Payments whose outcome is unknown and still open, by where they are recorded",
                               labels=["source"])
    family.add_metric(["dunning_attempt"], PaymentAttempt.objects.filter(state=AttemptState.UNKNOWN).count())
    family.add_metric(["agentpay_settlement"], Settlement.objects.filter(state="unknown").count())
    family.add_metric(["agentpay_fulfillment"], Fulfillment.objects.filter(state="unknown").count())
    yield family


def _alerts(now: datetime) -> Iterator[Metric]:
    rows = Alert.objects.order_by().values("kind").annotate(
        resolved=Count("pk", filter=Q(resolved_at__isnull=False)),
        open_owned=Count("pk", filter=Q(resolved_at__isnull=True, owner__isnull=False)),
        open_unowned=Count("pk", filter=Q(resolved_at__isnull=True, owner__isnull=True)))
    found = {row["kind"]: row for row in rows}
    family = GaugeMetricFamily("dunning_alerts", "Alert episodes by kind and state", labels=["kind", "state"])
    for kind in sorted(set(AlertKind.values) | set(found)):
        for state in ALERT_STATES:
            family.add_metric([kind, state], found.get(kind, {}).get(state, 0))
    yield family
    sent = dict(((c, s), n) for c, s, n in AlertDelivery.objects.order_by().values("channel", "status")
                .annotate(n=Count("pk")).values_list("channel", "status", "n"))
    deliveries = GaugeMetricFamily("dunning_alert_deliveries", "Alert deliveries by channel and status",
                                   labels=["channel", "status"])
    for channel in AlertChannel.values:
        for status in AlertDeliveryStatus.values:
            deliveries.add_metric([channel, status], sent.get((channel, status), 0))
    yield deliveries


def paid_to_full_latencies(now: datetime) -> tuple[list[float], int, int]:
    """(latencies in seconds, paid but not FULL since, paid while already FULL) over the window.

    Each invoice's first PAYMENT_SUCCEEDED fact recorded in the last METRICS_LATENCY_WINDOW_HOURS
    (newest METRICS_LATENCY_MAX_ROWS) is one payment. Its latency is the first FULL entitlement
    snapshot of the subscription issued at or after the fact was recorded, minus that time. A
    payment made while the snapshot in force was already FULL (grace with full access) restored
    nothing and is counted apart; one with no FULL snapshot since is "awaiting" (still restricted,
    or another invoice still blocks)."""
    window = timedelta(hours=int(getattr(settings, "METRICS_LATENCY_WINDOW_HOURS", 24)))
    limit = int(getattr(settings, "METRICS_LATENCY_MAX_ROWS", 10_000))
    paid = MonetaryFact.objects.filter(kind=FactKind.PAYMENT_SUCCEEDED)
    earlier = paid.filter(invoice_id=OuterRef("invoice_id")).filter(
        Q(recorded_at__lt=OuterRef("recorded_at")) | Q(recorded_at=OuterRef("recorded_at"), pk__lt=OuterRef("pk")))
    snapshots = EntitlementSnapshot.objects.filter(subscription_id=OuterRef("invoice__subscription_id"))
    in_force = snapshots.filter(issued_at__lt=OuterRef("recorded_at")).order_by("-generation").values("profile")[:1]
    first_full = (snapshots.filter(profile=FULL, issued_at__gte=OuterRef("recorded_at")).order_by("generation")
                  .values("issued_at")[:1])
    rows = (paid.filter(recorded_at__gt=now - window, recorded_at__lte=now).exclude(Exists(earlier))
            .annotate(in_force=Subquery(in_force), full_at=Subquery(first_full))
            .order_by("-recorded_at").values_list("recorded_at", "in_force", "full_at")[:limit])
    latencies: list[float] = []
    awaiting = already_full = 0
    for recorded_at, profile_in_force, full_at in rows:
        if profile_in_force == FULL:
            already_full += 1
        elif full_at is None:
            awaiting += 1
        else:
            latencies.append(max((full_at - recorded_at).total_seconds(), 0.0))
    return latencies, awaiting, already_full


def _paid_to_full(now: datetime) -> Iterator[Metric]:
    latencies, awaiting, already_full = paid_to_full_latencies(now)
    buckets = [(str(float(bound)), sum(1 for v in latencies if v <= bound)) for bound in LATENCY_BUCKETS]
    buckets.append(("+Inf", len(latencies)))
    yield HistogramMetricFamily(
        "dunning_paid_to_full_latency_seconds",
        "Paid fact recorded → entitlement FULL, over the payments of the recent window (recomputed each scrape: "
        "use histogram_quantile on the buckets as they are, not rate())", buckets=buckets, sum_value=sum(latencies))
    yield GaugeMetricFamily("dunning_paid_awaiting_full", "Payments of the window with no FULL entitlement since",
                            value=awaiting)
    yield GaugeMetricFamily("dunning_paid_while_full", "Payments of the window made while access was already FULL",
                            value=already_full)


SECTIONS: dict[str, Callable[[datetime], Iterable[Metric]]] = {
    "gates": _gates, "jobs": _jobs, "inbox": _inbox, "unknown_payments": _unknown_payments, "alerts": _alerts,
    "paid_to_full": _paid_to_full,
}


class DunningCollector(Collector):
    """Reads every family from the database when Prometheus scrapes."""

    def describe(self) -> Iterable[Metric]:
        return []  # nothing to announce at registration: collecting then would query the database

    def collect(self) -> Iterable[Metric]:
        now = trusted_now()
        health = GaugeMetricFamily("dunning_metrics_section_ok", "1 when the section's figures were read this scrape",
                                   labels=["section"])
        for name, section in SECTIONS.items():
            try:
                metrics = list(section(now))
            except Exception:
                log.exception("metrics section %s failed; left out of this scrape", name)
                health.add_metric([name], 0)
                continue
            health.add_metric([name], 1)
            yield from metrics
        yield health
