"""`/metrics` (issue 19 item 2): each family read from PostgreSQL at scrape time, protected by a
bearer token or loopback, and never a 500 (an empty database included)."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest
import time_machine
from prometheus_client.parser import text_string_to_metric_families

from dunning.gates import gates_evaluate
from dunning.web import metrics_collector
from dunning.web.metrics_collector import LATENCY_BUCKETS
from tests.alerting.figures import build_figures

NOW = datetime(2030, 3, 10, 12, 0, tzinfo=UTC)


def scrape(client, **headers) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


@pytest.fixture
def frozen():
    with time_machine.travel(NOW, tick=False):
        yield


def test_an_empty_database_scrapes_cleanly(db, client, frozen):
    samples = scrape(client)
    for section in metrics_collector.SECTIONS:
        assert value(samples, "dunning_metrics_section_ok", section=section) == 1
    assert value(samples, "dunning_inbox_pending_events") == 0
    assert value(samples, "dunning_alerts", kind="PAID_NOT_RESTORED", state="open_unowned") == 0
    assert value(samples, "dunning_job_lag_seconds", job="alerts") == math.inf  # never ran OK
    assert value(samples, "dunning_paid_to_full_latency_seconds_count") == 0
    assert value(samples, "dunning_gates_passed") == 1


def test_every_family_matches_the_database(policy, client, frozen):
    figures = build_figures(NOW)
    samples = scrape(client)
    assert value(samples, "dunning_inbox_pending_events") == figures.inbox_pending
    assert value(samples, "dunning_inbox_failed_events") == figures.inbox_failed
    assert value(samples, "dunning_inbox_oldest_pending_age_seconds") == 40
    assert value(samples, "dunning_unknown_payments_open", source="dunning_attempt") == figures.unknown_attempts
    assert value(samples, "dunning_unknown_payments_open", source="agentpay_settlement") == figures.unknown_settlements
    unknown_fulfillments = value(samples, "dunning_unknown_payments_open", source="agentpay_fulfillment")
    assert unknown_fulfillments == figures.unknown_fulfillments
    assert value(samples, "dunning_job_lag_seconds", job="alerts") == figures.alerts_lag_seconds
    assert value(samples, "dunning_job_last_success_timestamp_seconds", job="alerts") == NOW.timestamp() - 90
    assert value(samples, "dunning_alerts", kind="PAID_NOT_RESTORED", state="open_unowned") == 2
    assert value(samples, "dunning_alerts", kind="PAID_NOT_RESTORED", state="resolved") == 0

    assert value(samples, "dunning_paid_to_full_latency_seconds_count") == len(figures.latencies)
    assert value(samples, "dunning_paid_to_full_latency_seconds_sum") == sum(figures.latencies)
    for bound in LATENCY_BUCKETS:
        expected = sum(1 for latency in figures.latencies if latency <= bound)
        assert value(samples, "dunning_paid_to_full_latency_seconds_bucket", le=str(float(bound))) == expected
    assert value(samples, "dunning_paid_awaiting_full") == 1  # paid an hour ago, still SUSPENDED

    report = gates_evaluate(now=NOW)
    for gate in report.gates:
        assert value(samples, "dunning_gate_passed", gate=gate.key) == (1 if gate.passed else 0)
        assert value(samples, "dunning_gate_sample_size", gate=gate.key) == gate.sample_size
        figure = value(samples, "dunning_gate_value", gate=gate.key, unit=gate.unit)
        assert math.isnan(figure) if gate.figure is None else figure == pytest.approx(gate.figure)


def test_a_failing_section_is_reported_not_a_500(db, client, frozen, monkeypatch):
    def broken(now):
        raise RuntimeError("database went away")

    monkeypatch.setitem(metrics_collector.SECTIONS, "inbox", broken)
    samples = scrape(client)
    assert value(samples, "dunning_metrics_section_ok", section="inbox") == 0
    assert value(samples, "dunning_metrics_section_ok", section="alerts") == 1
    assert not any(name.startswith("dunning_inbox") for name, _ in samples)


def test_access_needs_the_token_when_one_is_set_and_loopback_otherwise(db, client, settings):
    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 403
    assert client.post("/metrics").status_code == 405
    settings.METRICS_TOKEN = "s3cret-scrape-token"
    refused = client.get("/metrics")
    assert refused.status_code == 401 and refused["WWW-Authenticate"].startswith("Bearer")
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    ok = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-scrape-token", REMOTE_ADDR="10.1.2.3")
    assert ok.status_code == 200 and b"dunning_alerts" in ok.content


def test_openmetrics_is_served_when_asked_for(db, client):
    response = client.get("/metrics", HTTP_ACCEPT="application/openmetrics-text; version=1.0.0")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/openmetrics-text")
    assert response.content.rstrip().endswith(b"# EOF")
