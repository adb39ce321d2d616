"""The usage-record API over HTTP: status codes, problem bodies, auth, the listing, the export in a
REVOKED profile, and the OpenAPI schema."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

import pytest

from dunning.clock import trusted_now
from dunning.models import DunningCycle
from entitlements.api.tokens import service_token_create
from subscriptions.models import UsageRecord
from tests.support.actors import AGENTS, LEADS, bearer_client, make_staff, perms_of, session_client
from tests.support.builders import make_subscription

pytestmark = pytest.mark.django_db
URL = "/api/v1/usage-records/"
PROBLEM = "application/problem+json"


def body(sub, record_id="run-1", **overrides):
    fields = {"producer_record_id": record_id, "subscription": sub.provider_subscription_id, "metric": "tokens",
              "quantity": 1200, "cost": 36, "currency": "usd", "occurred_at": "2026-01-05T10:00:00Z"}
    fields.update(overrides)
    return fields


def _problem(response, status, slug):
    assert response.status_code == status, response.content
    assert response["Content-Type"] == PROBLEM
    data = response.json()
    assert data["status"] == status and data["type"].endswith("/" + slug), data
    return data


def test_a_record_is_created_then_replayed_with_the_same_body(producer_client, policy):
    sub = make_subscription()
    created = producer_client.post(URL, body(sub), format="json")
    assert created.status_code == 201, created.content
    record = created.json()
    assert record["producer"] == "inference-meter" and record["subscription"] == sub.pk
    assert (record["metric"], record["quantity"], record["cost"], record["invoiced"]) == ("tokens", 1200, 36, False)
    # The same record naming the subscription by its local id, currency in capitals: the same record.
    again = producer_client.post(URL, body(sub, subscription=str(sub.pk), currency="USD"), format="json")
    assert again.status_code == 200 and again["Idempotent-Replayed"] == "true"
    assert again.json() == record
    assert UsageRecord.objects.count() == 1


def test_a_duplicate_producer_id_with_another_body_is_422_and_changes_nothing(producer_client, policy):
    sub = make_subscription()
    first = producer_client.post(URL, body(sub), format="json").json()
    before = list(UsageRecord.objects.values())
    data = _problem(producer_client.post(URL, body(sub, quantity=99), format="json"), 422, "producer-record-id-reused")
    assert data["record"] == first["id"] and "run-1" in data["detail"]
    assert list(UsageRecord.objects.values()) == before


@pytest.mark.parametrize("change, field", [
    ({"quantity": 0}, "quantity"), ({"quantity": "many"}, "quantity"), ({"cost": -5}, "cost"),
    ({"metric": "bytes"}, "metric"), ({"currency": "US"}, "currency"), ({"occurred_at": "yesterday"}, "occurred_at"),
    ({"producer_record_id": ""}, "producer_record_id"), ({"subscription": None}, "subscription"),
])
def test_malformed_records_are_400_with_field_faults(producer_client, policy, change, field):
    sub = make_subscription()
    data = _problem(producer_client.post(URL, body(sub, **change), format="json"), 400, "validation-error")
    assert field in {e["field"] for e in data["errors"]}
    assert not UsageRecord.objects.exists()


def test_a_missing_field_and_a_future_time_are_400(producer_client, policy):
    sub = make_subscription()
    fields = body(sub)
    del fields["cost"]
    assert "cost" in {e["field"] for e in _problem(producer_client.post(URL, fields, format="json"), 400,
                                                     "validation-error")["errors"]}
    future = (trusted_now() + timedelta(days=2)).isoformat()
    data = _problem(producer_client.post(URL, body(sub, occurred_at=future), format="json"), 400, "validation-error")
    assert data["errors"][0]["field"] == "occurred_at" and "future" in data["errors"][0]["message"]
    assert not UsageRecord.objects.exists()


def test_a_body_that_is_not_json_is_400(producer_client, policy):
    response = producer_client.post(URL, "{not json", content_type="application/json")
    _problem(response, 400, "malformed-request")


def test_an_unknown_subscription_is_404(producer_client, policy):
    _problem(producer_client.post(URL, body(make_subscription(), subscription="sub_nope"), format="json"),
             404, "not-found")
    assert not UsageRecord.objects.exists()


def test_a_token_restricted_to_another_account_sees_no_subscription(policy):
    _, raw = service_token_create(name="other-account-meter", scopes=("usage:write",), provider_account="acct_other")
    _problem(bearer_client(raw).post(URL, body(make_subscription()), format="json"), 404, "not-found")


def test_only_a_usage_write_token_may_report_usage(client, policy, reader_client):
    sub = make_subscription()
    _problem(client.post(URL, body(sub), content_type="application/json"), 401, "not-authenticated")
    _problem(reader_client.post(URL, body(sub), format="json"), 403, "forbidden")
    staff = session_client(make_staff("agent", AGENTS))
    _problem(staff.post(URL, body(sub), format="json"), 403, "forbidden")
    _problem(bearer_client("dsvc_wrong").post(URL, body(sub), format="json"), 401, "authentication-failed")
    assert not UsageRecord.objects.exists()


def test_a_revoked_subscription_still_records_and_exports_usage(producer_client, reader_client, revoked_subscription):
    sub = revoked_subscription
    cycles_before = list(DunningCycle.objects.filter(subscription=sub).values())
    assert producer_client.post(URL, body(sub, "a"), format="json").status_code == 201
    assert producer_client.post(URL, body(sub, "b", metric="calls", quantity=4, cost=8), format="json"
                                ).status_code == 201
    exported = reader_client.get(f"/api/v1/subscriptions/{sub.pk}/usage/export.csv")
    assert exported.status_code == 200 and exported["Content-Type"].startswith("text/csv")
    assert "attachment" in exported["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(b"".join(exported.streaming_content).decode())))
    assert [(r["producer_record_id"], r["metric"], r["quantity"], r["cost"], r["invoiced_at"]) for r in rows] == [
        ("a", "tokens", "1200", "36", ""), ("b", "calls", "4", "8", "")]
    as_json = reader_client.get(f"/api/v1/subscriptions/{sub.provider_subscription_id}/usage/export.json").json()
    assert as_json["entitlement_profile"] == "REVOKED" and as_json["currency"] == "usd"
    assert {t["metric"]: t["uninvoiced_cost"] for t in as_json["totals"]} == {"calls": 8, "tokens": 36}
    assert len(as_json["records"]) == 2
    assert list(DunningCycle.objects.filter(subscription=sub).values()) == cycles_before


def test_the_listing_is_newest_first_and_needs_billing_read(producer_client, reader_client, policy):
    sub = make_subscription()
    for n in range(3):
        producer_client.post(URL, body(sub, f"r{n}", occurred_at=f"2026-01-0{n + 1}T10:00:00Z"), format="json")
    listing = reader_client.get(f"/api/v1/subscriptions/{sub.pk}/usage/")
    assert listing.status_code == 200
    assert [r["producer_record_id"] for r in listing.json()["results"]] == ["r2", "r1", "r0"]
    _problem(producer_client.get(f"/api/v1/subscriptions/{sub.pk}/usage/"), 403, "forbidden")
    _problem(reader_client.get("/api/v1/subscriptions/sub_missing/usage/"), 404, "not-found")
    _problem(reader_client.get("/api/v1/subscriptions/sub_missing/usage/export.csv"), 404, "not-found")


def test_staff_with_the_read_permission_export_too(policy, producer_client):
    sub = make_subscription()
    producer_client.post(URL, body(sub), format="json")
    staff = session_client(make_staff("agent", AGENTS))
    response = staff.get(f"/api/v1/subscriptions/{sub.pk}/usage/export.json")
    assert response.status_code == 200 and len(response.json()["records"]) == 1


def test_the_endpoints_are_in_the_openapi_schema(client, db):
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    paths = schema["paths"]
    post = paths["/api/v1/usage-records/"]["post"]
    assert {"201", "200", "400", "404", "422"} <= set(post["responses"])
    assert "text/csv" in paths["/api/v1/subscriptions/{ref}/usage/export.csv"]["get"]["responses"]["200"]["content"]
    assert "/api/v1/subscriptions/{ref}/usage/" in paths
    assert "/api/v1/subscriptions/{ref}/usage/export.json" in paths


BATCH = "/api/v1/usage-records/batch/"


def test_a_batch_records_each_and_reports_replays_and_conflicts_one_by_one(producer_client, policy):
    sub = make_subscription()
    producer_client.post(URL, body(sub, "old"), format="json")
    producer_client.post(URL, body(sub, "clash"), format="json")
    records = [body(sub, "new-1"), body(sub, "old"), body(sub, "clash", quantity=1), body(sub, "new-2", metric="calls")]
    response = producer_client.post(BATCH, {"records": records}, format="json")
    assert response.status_code == 200, response.content
    data = response.json()
    assert [r["status"] for r in data["results"]] == [201, 200, 422, 201]
    assert (data["created"], data["replayed"], data["conflicts"]) == (2, 1, 1)
    assert data["results"][2]["record"] is None and "clash" in data["results"][2]["detail"]
    assert sorted(UsageRecord.objects.values_list("producer_record_id", flat=True)) == ["clash", "new-1", "new-2",
                                                                                         "old"]
    assert UsageRecord.objects.get(producer_record_id="clash").quantity == 1200  # the conflict changed nothing
    again = producer_client.post(BATCH, {"records": records}, format="json").json()
    assert [r["status"] for r in again["results"]] == [200, 200, 422, 200]


@pytest.mark.parametrize("fault, field", [
    ({"quantity": 0}, "records.1.quantity"),
    ({"occurred_at": "2099-01-01T00:00:00Z"}, "records.1.occurred_at"),
    ({"currency": "eur"}, "records.1.currency"),
])
def test_a_batch_with_one_bad_record_is_400_and_records_none(producer_client, policy, fault, field):
    sub = make_subscription()
    producer_client.post(URL, body(sub, "sets-usd"), format="json")
    response = producer_client.post(BATCH, {"records": [body(sub, "ok"), body(sub, "bad", **fault)]}, format="json")
    data = _problem(response, 400, "validation-error")
    assert field in {e["field"] for e in data["errors"]}
    assert list(UsageRecord.objects.values_list("producer_record_id", flat=True)) == ["sets-usd"]


def test_a_batch_naming_an_unknown_subscription_is_404_and_records_none(producer_client, policy):
    sub = make_subscription()
    records = [body(sub, "ok"), body(sub, "lost", subscription="sub_unknown")]
    _problem(producer_client.post(BATCH, {"records": records}, format="json"), 404, "not-found")
    _problem(producer_client.post(BATCH, {"records": []}, format="json"), 400, "validation-error")
    assert not UsageRecord.objects.exists()


def test_both_staff_roles_may_view_usage_records_and_neither_change_them(db):
    for group in (AGENTS, LEADS):
        perms = perms_of(group)
        assert "subscriptions.view_usagerecord" in perms
        assert not {"subscriptions.change_usagerecord", "subscriptions.delete_usagerecord"} & perms
