"""A real Prometheus server (Debian's package) scrapes the live server's /metrics every second on
loopback, and the figures read back through its HTTP API are the database's (issue 19 item 2)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from dunning.models import EventOutcome, ProviderEvent
from tests.alerting.figures import build_figures
from tests.support import prometheus as helper
from tests.support.prometheus import start_prometheus

pytestmark = pytest.mark.django_db(transaction=True)
TOKEN = "scrape-token-for-the-test"


@pytest.fixture
def prometheus(live_server, settings):
    settings.METRICS_TOKEN = TOKEN  # the scrape goes through the bearer check, as in production
    host, port = live_server.thread.httpd.server_address[:2]
    server = start_prometheus(target=f"{host}:{port}", bearer_token=TOKEN)
    yield server
    server.stop()


def pending_in_db() -> int:
    return ProviderEvent.objects.filter(outcome=EventOutcome.PENDING, processed_at__isnull=True).count()


def test_prometheus_scrapes_metrics_and_its_api_gives_the_database_figures(policy, prometheus):
    now = timezone.now()
    figures = build_figures(now)
    assert prometheus.wait_for('up{job="dunning"}', lambda v: v == 1) == 1

    assert prometheus.wait_for("dunning_inbox_pending_events", lambda v: v is not None) == pending_in_db() == 2
    fulfillments = 'dunning_unknown_payments_open{source="agentpay_fulfillment"}'
    assert prometheus.scalar(fulfillments) == figures.unknown_fulfillments
    assert prometheus.scalar("dunning_paid_to_full_latency_seconds_count") == len(figures.latencies)
    assert prometheus.scalar('sum(dunning_alerts{kind="PAID_NOT_RESTORED", state="open_unowned"})') == 2

    # A change in the database shows in Prometheus on a later scrape: read at scrape time, not cached.
    ProviderEvent.objects.create(event_id="evt_after_first_scrape", event_type="invoice.paid", account="acct_test",
                                 payload={}, signature_verified=True, received_at=now - timedelta(seconds=1))
    assert prometheus.wait_for("dunning_inbox_pending_events", lambda v: v == 3) == pending_in_db() == 3


def test_a_missing_prometheus_binary_fails_the_test_with_the_reason(monkeypatch):
    monkeypatch.setattr(helper, "PROMETHEUS", "/nonexistent/prometheus")
    with pytest.raises(RuntimeError, match=r"apt-get install -y prometheus"):
        helper.start_prometheus(target="127.0.0.1:9")
