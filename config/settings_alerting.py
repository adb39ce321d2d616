"""Settings of alert delivery and the Prometheus endpoint (issue 19 item 2; docs/alerting.md)."""

import os

# Where the alert emails and the case links point: the console's public address.
SITE_URL = os.environ.get("SITE_URL", os.environ.get("DUNNING_PUBLIC_BASE_URL", "http://localhost:8000"))
# Empty list / empty URL: that channel is off (each alert still records the delivery as SKIPPED, saying so).
ALERT_ONCALL_EMAILS = [a.strip() for a in os.environ.get("ALERT_ONCALL_EMAILS", "").split(",") if a.strip()]
ALERT_WEBHOOK_URL = os.environ.get("ALERT_WEBHOOK_URL", "")
ALERT_WEBHOOK_SECRET = os.environ.get("ALERT_WEBHOOK_SECRET", "")
ALERT_WEBHOOK_TIMEOUT_SECONDS = float(os.environ.get("ALERT_WEBHOOK_TIMEOUT_SECONDS", "5"))
# A failed send is tried again after 30 s, 60 s, 120 s … (capped), ALERT_DELIVERY_MAX_ATTEMPTS tries in all.
ALERT_DELIVERY_MAX_ATTEMPTS = int(os.environ.get("ALERT_DELIVERY_MAX_ATTEMPTS", "5"))
ALERT_DELIVERY_BACKOFF_BASE_SECONDS = int(os.environ.get("ALERT_DELIVERY_BACKOFF_BASE_SECONDS", "30"))
ALERT_DELIVERY_BACKOFF_MAX_SECONDS = int(os.environ.get("ALERT_DELIVERY_BACKOFF_MAX_SECONDS", "1800"))

# /metrics: with a token, a scrape must send `Authorization: Bearer <token>`; without one, only
# loopback clients are answered (a scraper on the same host, the tests).
METRICS_TOKEN = os.environ.get("METRICS_TOKEN", "")
# The paid → FULL histogram covers paid facts recorded in this many recent hours (at most METRICS_LATENCY_MAX_ROWS).
METRICS_LATENCY_WINDOW_HOURS = int(os.environ.get("METRICS_LATENCY_WINDOW_HOURS", "24"))
METRICS_LATENCY_MAX_ROWS = int(os.environ.get("METRICS_LATENCY_MAX_ROWS", "10000"))
