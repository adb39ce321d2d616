"""GET /api/v1/subscriptions/{id}/entitlement: what runtime services read, with an ETag from
the generation and 304 while it holds."""

from __future__ import annotations

from tests.support.builders import restrict

URL = "/api/v1/subscriptions/{}/entitlement"


def test_a_runtime_service_reads_the_entitlement_by_provider_id(token_client, subscription):
    response = token_client().get(URL.format(subscription.provider_subscription_id))
    assert response.status_code == 200
    body = response.json()
    assert body["subscription"] == subscription.pk
    assert body["provider_subscription_id"] == subscription.provider_subscription_id
    assert (body["generation"], body["profile"]) == (1, "FULL")
    assert body["capabilities"]["write"] is True and body["capabilities"]["export"] is True
    assert body["reason"] and body["issued_at"]
    assert response["ETag"] == f'"sub-{subscription.pk}-g1"'
    assert response["Cache-Control"] == "private, max-age=0, must-revalidate"


def test_the_local_id_works_too(token_client, subscription):
    assert token_client().get(URL.format(subscription.pk)).json()["provider_subscription_id"] == (
        subscription.provider_subscription_id)


def test_if_none_match_with_the_current_etag_is_304(token_client, subscription):
    client = token_client()
    etag = client.get(URL.format(subscription.pk))["ETag"]
    response = client.get(URL.format(subscription.pk), HTTP_IF_NONE_MATCH=etag)
    assert response.status_code == 304
    assert response.content == b""
    assert response["ETag"] == etag
    assert client.get(URL.format(subscription.pk), HTTP_IF_NONE_MATCH=f'"other", W/{etag}').status_code == 304
    assert client.get(URL.format(subscription.pk), HTTP_IF_NONE_MATCH='"sub-0-g0"').status_code == 200


def test_an_accepted_transition_that_changes_the_decision_changes_the_etag(token_client, grace_cycle):
    client = token_client()
    url = URL.format(grace_cycle.subscription_id)
    first = client.get(url)
    assert first.json()["profile"] == "READ_EXPORT_NO_NEW_JOBS"
    restrict(grace_cycle)
    second = client.get(url, HTTP_IF_NONE_MATCH=first["ETag"])
    assert second.status_code == 200
    assert second["ETag"] != first["ETag"]
    assert second.json()["generation"] == first.json()["generation"] + 1
    assert second.json()["profile"] == "SUSPENDED"
    assert second.json()["capabilities"]["api_tokens"] == "none"


def test_unknown_subscription_is_a_404_problem(token_client, db):
    response = token_client().get(URL.format("sub_nope"))
    assert response.status_code == 404
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["type"] == "https://dunning.invalid/problems/not-found"


def test_a_staff_member_with_the_read_permission_may_read_it(agent_client, subscription):
    assert agent_client.get(URL.format(subscription.pk)).status_code == 200
