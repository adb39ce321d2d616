"""Hostile input on the usage-record API: NUL bytes, wrong types, numbers no column holds,
unreadable JSON and unknown ids are a clear 4xx problem, never a 500, and record nothing."""

from __future__ import annotations

import pytest

from subscriptions.models import UsageRecord
from tests.support.builders import make_policy, make_subscription

URL = "/api/v1/usage-records/"


def record(sub, **overrides):
    fields = {"producer_record_id": "run-1", "subscription": sub.provider_subscription_id, "metric": "tokens",
              "quantity": 1200, "cost": 36, "currency": "usd", "occurred_at": "2026-01-05T10:00:00Z"}
    fields.update(overrides)
    return fields


@pytest.fixture
def sub(db):
    make_policy()
    return make_subscription()


@pytest.mark.parametrize("change", [
    {"producer_record_id": "a\x00b"},
    {"subscription": "sub_\x00x"},
    {"metric": "\x00"},
    {"quantity": 10**30},
    {"quantity": [1]},
    {"quantity": "1e400"},
    {"cost": -(10**30)},
    {"currency": {"code": "usd"}},
    {"occurred_at": "2026-13-45T99:00:00Z"},
    {"producer_record_id": "x" * 100_000},
    {"subscription": str(10**30)},
])
def test_a_hostile_record_is_a_4xx_and_records_nothing(producer_client, sub, change):
    answer = producer_client.post(URL, record(sub, **change), format="json")
    assert 400 <= answer.status_code < 500, (answer.status_code, answer.content[:300])
    assert answer["Content-Type"].startswith("application/problem+json")
    assert not UsageRecord.objects.exists()


@pytest.mark.parametrize("body", [b"{", b"\xff\xfe", b"[" * 5000, b'{"producer_record_id": "\\u0000"}'])
def test_unreadable_bodies_are_a_4xx(producer_client, sub, body):
    for url in (URL, URL + "batch/"):
        answer = producer_client.post(url, body, content_type="application/json")
        assert 400 <= answer.status_code < 500, (url, answer.status_code, answer.content[:300])
    assert not UsageRecord.objects.exists()


def test_a_batch_of_the_wrong_shape_is_a_4xx(producer_client, sub):
    for body in ({"records": "no"}, {"records": [1, 2]}, [record(sub)] * 501, {"records": [record(sub)] * 501}):
        answer = producer_client.post(URL + "batch/", body, format="json")
        assert 400 <= answer.status_code < 500, (answer.status_code, answer.content[:300])
    assert not UsageRecord.objects.exists()


@pytest.mark.parametrize("ref", ["sub_\x00x", "9" * 40, "nosuch"])
def test_usage_reads_of_unknown_or_hostile_refs_are_a_4xx(reader_client, db, ref):
    for suffix in ("", "export.csv", "export.json"):
        answer = reader_client.get(f"/api/v1/subscriptions/{ref}/usage/{suffix}")
        assert 400 <= answer.status_code < 500, (suffix, answer.status_code)
