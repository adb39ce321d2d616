"""Every status query leaves one append-only evidence row (wallet-ledger-spec §9.3), errors too."""

from __future__ import annotations

import socket

import pytest
from django.db import connection, transaction
from django.urls import reverse

from agentpay.jobs import agentpay_job_run
from agentpay.models import FulfillmentStatusQuery, IntentReceipt, PaymentIntent, PricedRoute
from agentpay.models.append_only import AppendOnlyViolation

pytestmark = pytest.mark.django_db


def unknown_intent(call, route: str = "boom") -> PaymentIntent:
    response = call(route)
    assert response.status_code in (502, 504)
    return PaymentIntent.objects.select_related("fulfillment").get(intent_id=response.json()["intent_id"])


def rows(intent: PaymentIntent) -> list[FulfillmentStatusQuery]:
    return list(FulfillmentStatusQuery.objects.filter(fulfillment__intent=intent).order_by("pk"))


def test_n_queries_leave_n_rows_and_the_conclusive_one_is_cited(funded, routes, upstream, call):
    intent = unknown_intent(call)
    ful = intent.fulfillment.fulfillment_id
    for answer in ("in_progress", "503", "not_found"):
        upstream.status_override[ful] = answer
        agentpay_job_run("agentpay_fulfillment_status_query")
    upstream.status_override.pop(ful)  # /boom did act: succeeded
    agentpay_job_run("agentpay_fulfillment_status_query")
    got = rows(intent)
    assert [(r.answer, r.http_status, r.proves) for r in got] == [
        ("in_progress", 200, ""), ("inconclusive", 503, ""), ("not_found", 200, ""),
        ("succeeded", 200, "upstream_status_query_ok")]
    assert got[1].error == "HTTP 503" and all(len(r.body_digest) == 64 for r in got)
    # The request id we sent is the one on the row.
    assert [str(r.request_id) for r in got] == [q["request_id"] for q in upstream.status_queries]
    receipt = IntentReceipt.objects.get(intent=intent, event="upstream_status_query_ok", accepted=True)
    assert receipt.data["query_id"] == got[-1].pk
    intent.fulfillment.refresh_from_db()
    assert intent.fulfillment.status_queries == 4 and intent.state == "authorized"
    assert PaymentIntent.objects.get(pk=intent.pk).state == "completed"
    assert agentpay_job_run("agentpay_fulfillment_status_query").examined == 0  # resolved: nobody asks again


def test_an_unreachable_upstream_still_leaves_a_row(funded, routes, call):
    intent = unknown_intent(call)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    PricedRoute.objects.filter(pk=intent.route_id).update(status_query_url=f"http://127.0.0.1:{closed}/status")
    agentpay_job_run("agentpay_fulfillment_status_query")
    agentpay_job_run("agentpay_fulfillment_status_query")
    got = rows(intent)
    assert len(got) == 2
    assert all(r.answer == "inconclusive" and r.http_status is None and "Connection" in r.error for r in got)
    assert PaymentIntent.objects.get(pk=intent.pk).state == "authorized"


def test_a_timed_out_query_leaves_a_row(funded, routes, upstream, call, settings):
    settings.AGENTPAY_STATUS_QUERY_TIMEOUT_SECONDS = 0.3
    upstream.hang_seconds = 1.0
    intent = unknown_intent(call)
    upstream.status_override[intent.fulfillment.fulfillment_id] = "hang"
    agentpay_job_run("agentpay_fulfillment_status_query")
    (row,) = rows(intent)
    assert row.timed_out and row.answer == "inconclusive" and row.http_status is None
    assert row.latency_ms >= 250 and "timed out" in row.error


def test_a_row_cannot_be_rewritten_or_deleted(funded, routes, upstream, call):
    intent = unknown_intent(call)
    upstream.status_override[intent.fulfillment.fulfillment_id] = "in_progress"
    agentpay_job_run("agentpay_fulfillment_status_query")
    (row,) = rows(intent)
    row.answer = "succeeded"
    with pytest.raises(AppendOnlyViolation):
        row.save()
    with pytest.raises(AppendOnlyViolation):
        FulfillmentStatusQuery.objects.filter(pk=row.pk).update(answer="succeeded")
    with pytest.raises(AppendOnlyViolation):
        row.delete()
    # Past the model layer, the database refuses too.
    for sql in ("UPDATE agentpay_fulfillmentstatusquery SET answer = 'succeeded'",
                "DELETE FROM agentpay_fulfillmentstatusquery"):
        with pytest.raises(Exception, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql)
    assert FulfillmentStatusQuery.objects.get(pk=row.pk).answer == "in_progress"


def test_the_intent_timeline_shows_every_query(funded, routes, upstream, call, lead, client):
    intent = unknown_intent(call)
    upstream.status_override[intent.fulfillment.fulfillment_id] = "500"
    agentpay_job_run("agentpay_fulfillment_status_query")
    upstream.status_override[intent.fulfillment.fulfillment_id] = "in_progress"
    agentpay_job_run("agentpay_fulfillment_status_query")
    client.force_login(lead)
    page = client.get(reverse("admin:agentpay_paymentintent_change", args=[intent.pk])).content.decode()
    assert page.count("ap-kind ap-kind-query") == 2
    assert "status query → inconclusive" in page and "HTTP 500" in page and "status query → in_progress" in page
