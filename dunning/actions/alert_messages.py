"""What an alert says to a person: the email, the Slack-compatible webhook body and its signature.

Both carry an absolute link to the alert's case page in the console (`SITE_URL` + the admin URL).
The webhook is signed like the entitlement push (`entitlements.push.push_signature`):
``Dunning-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>``; a receiver
recomputes it over the raw body and refuses a timestamp older than a few minutes (replays).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import datetime
from typing import Any

from django.conf import settings
from django.urls import reverse

from dunning.models import Alert
from entitlements.push import push_signature

SIGNATURE_HEADER = "Dunning-Signature"
MESSAGE_ID_HEADER = "Dunning-Message-Id"
SIGNATURE_TOLERANCE_SECONDS = 300
# Slack's limits: a header block's text, a section's text, a field's text.
HEADER_LIMIT, SECTION_LIMIT, FIELD_LIMIT = 150, 3000, 2000


def alert_case_url(alert: Alert) -> str:
    base = str(getattr(settings, "SITE_URL", "") or "http://localhost:8000").rstrip("/")
    return f"{base}{reverse('admin:dunning_alert_change', args=[alert.pk])}"


def _facts(alert: Alert) -> list[tuple[str, str]]:
    rows = [("Raised", f"{alert.raised_at:%Y-%m-%d %H:%M:%S} UTC"), ("Alert key", alert.dedupe_key)]
    if alert.subscription_id:
        rows.append(("Subscription", alert.subscription.provider_subscription_id))
    if alert.invoice_id:
        rows.append(("Invoice", alert.invoice.provider_invoice_id))
    return rows


def alert_email(alert: Alert) -> tuple[str, str]:
    """(subject, body) of the on-call email."""
    title = alert.get_kind_display()
    subject = " ".join(f"[dunning alert] {title}: {alert.detail}".split())[:200]
    lines = [title, "", alert.detail, ""]
    lines += [f"{name}: {value}" for name, value in _facts(alert)]
    if alert.figures:
        lines += ["", "Figures:"] + [f"  {k}: {v}" for k, v in sorted(alert.figures.items())]
    lines += ["", f"Open the case: {alert_case_url(alert)}", "",
              "You receive this because your address is on the on-call list (ALERT_ONCALL_EMAILS)."]
    return subject, "\n".join(lines) + "\n"


def _slack_escape(text: str) -> str:
    """Slack's mrkdwn reads &, < and > as markup; a detail must show as written."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def alert_webhook_payload(alert: Alert) -> dict[str, Any]:
    """A Slack-compatible message (`text` for notifications and old clients, `blocks` for layout)."""
    url = alert_case_url(alert)
    title = alert.get_kind_display()
    detail = _slack_escape(alert.detail)
    fields = [{"type": "mrkdwn", "text": _cut(f"*{name}*\n{_slack_escape(value)}", FIELD_LIMIT)}
              for name, value in _facts(alert)]
    return {
        "text": _cut(f"ALERT {title}: {detail} <{url}|Open the case>", SECTION_LIMIT),
        "blocks": [
            {"type": "header", "text": {"type": "plain_text", "text": _cut(f"ALERT: {title}", HEADER_LIMIT)}},
            {"type": "section", "text": {"type": "mrkdwn", "text": _cut(detail, SECTION_LIMIT)}},
            {"type": "section", "fields": fields},
            {"type": "actions", "elements": [
                {"type": "button", "text": {"type": "plain_text", "text": "Open the case"}, "url": url,
                 "action_id": "open_case"}]},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": f"alert {alert.pk} · {alert.kind}"}]},
        ],
    }


def alert_webhook_body(alert: Alert) -> bytes:
    return json.dumps(alert_webhook_payload(alert), ensure_ascii=False, sort_keys=True,
                      separators=(",", ":")).encode()


def alert_webhook_headers(*, message_key: str, secret: str, body: bytes, sent_at: datetime) -> dict[str, str]:
    return {"Content-Type": "application/json; charset=utf-8", "User-Agent": "dunning-alerts/1",
            MESSAGE_ID_HEADER: message_key,
            SIGNATURE_HEADER: push_signature(secret, int(sent_at.timestamp()), body)}


def signature_verify(*, header: str, body: bytes, secret: str, now: datetime,
                     tolerance_seconds: int = SIGNATURE_TOLERANCE_SECONDS) -> bool:
    """The receiving side's check (documented for integrators): the HMAC matches and the
    timestamp is within `tolerance_seconds` of `now`."""
    parts = dict(item.split("=", 1) for item in header.split(",") if "=" in item)
    try:
        timestamp = int(parts.get("t", ""))
    except ValueError:
        return False
    expected = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    fresh = abs(now.timestamp() - timestamp) <= tolerance_seconds
    return fresh and hmac.compare_digest(expected, parts.get("v1", ""))
