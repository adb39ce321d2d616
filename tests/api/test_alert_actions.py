"""Alerts can be handled (issue 15, item 8): acknowledge (take ownership) and resolve (with a note),
each an append-only AlertAction; the list of open alerts; and the jobs never resolve what only a
person can see is over."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from dunning.actions.alerts import AlertRefused, alert_raise, alert_resolve
from dunning.jobs.framework import job_run
from dunning.models import Alert, AlertKind, FactKind, MonetaryFact
from dunning.models.operations import AlertAction
from dunning.states import CycleState
from tests.support.actors import session_client
from tests.support.builders import accept, local_policy, make_subscription, open_cycle, paid_evidence, reload
from tests.support.paths import Walker

NOON = datetime(2030, 3, 10, 12, 0, tzinfo=UTC)


def raise_alert(kind=AlertKind.DUPLICATE_CHARGE, key="duplicate_charge:in_1", *, now=NOON, **kwargs):
    return alert_raise(kind=kind, dedupe_key=key, detail=f"{kind} seen", figures=kwargs.pop("figures", {}), now=now,
                       **kwargs)


def ack(client, alert, body=None, key="ack-1"):
    return client.post(f"/api/v1/alerts/{alert.pk}/acknowledge", body or {}, format="json",
                       HTTP_IDEMPOTENCY_KEY=key)


def resolve(client, alert, body, key="res-1"):
    return client.post(f"/api/v1/alerts/{alert.pk}/resolve", body, format="json", HTTP_IDEMPOTENCY_KEY=key)


def trail(alert):
    return list(AlertAction.objects.filter(alert=alert).order_by("pk")
                .values_list("action", "actor", "note", "previous_owner"))


# --------------------------------------------------------------------------- API: acknowledge, resolve


def test_an_agent_acknowledges_and_a_lead_takes_it_over(db, agent, agent_client, lead_client):
    alert = raise_alert()

    mine = ack(agent_client, alert, {"note": "looking at the provider dashboard"})

    assert mine.status_code == 200, mine.content
    body = mine.json()
    assert (body["owner"], body["open"], body["needs_a_person"]) == ("agent", True, True)
    assert body["acknowledged_at"] and body["resolved_at"] is None
    assert body["actions"] == [{"action": "ACKNOWLEDGE", "actor": "agent", "note": "looking at the provider dashboard",
                                "previous_owner": "", "at": body["acknowledged_at"]}]
    taken = ack(lead_client, alert, key="ack-2")
    assert taken.status_code == 200 and taken.json()["owner"] == "lead"
    same = ack(lead_client, alert, key="ack-3")
    assert same.status_code == 200 and same.json()["owner"] == "lead"
    assert trail(alert) == [("ACKNOWLEDGE", "agent", "looking at the provider dashboard", ""),
                            ("ACKNOWLEDGE", "lead", "", "agent")], "acknowledging your own alert again adds nothing"
    alert.refresh_from_db()
    assert alert.owner.username == "lead" and alert.resolved_at is None


def test_resolving_needs_a_note_and_happens_once(db, agent_client, lead_client):
    alert = raise_alert()
    for i, body in enumerate(({}, {"note": "   "})):
        refused = resolve(agent_client, alert, body, key=f"bad-{i}")
        assert refused.status_code == 400 and refused["Content-Type"] == "application/problem+json"
        assert [e["field"] for e in refused.json()["errors"]] == ["note"]
    assert Alert.objects.get(pk=alert.pk).resolved_at is None

    done = resolve(agent_client, alert, {"note": "refunded ch_2 in the provider dashboard"})

    assert done.status_code == 200, done.content
    body = done.json()
    assert (body["open"], body["resolved_by"], body["resolution_note"]) == (
        False, "agent", "refunded ch_2 in the provider dashboard")
    assert trail(alert) == [("RESOLVE", "agent", "refunded ch_2 in the provider dashboard", "")]
    again = resolve(lead_client, alert, {"note": "me too"}, key="res-2")
    assert again.status_code == 409 and again.json()["code"] == "ALERT_RESOLVED"
    assert "already resolved by agent" in again.json()["detail"]
    late_ack = ack(lead_client, alert, key="ack-late")
    assert late_ack.status_code == 409 and "nothing left to take on" in late_ack.json()["detail"]
    assert len(trail(alert)) == 1


def test_the_same_key_replays_and_the_action_is_recorded_once(db, agent_client):
    alert = raise_alert()
    first = resolve(agent_client, alert, {"note": "checked: one charge was a test"}, key="once")
    again = resolve(agent_client, alert, {"note": "checked: one charge was a test"}, key="once")
    assert first.status_code == again.status_code == 200
    assert again["Idempotent-Replayed"] == "true" and again.json() == first.json()
    assert len(trail(alert)) == 1
    no_key = agent_client.post(f"/api/v1/alerts/{alert.pk}/resolve", {"note": "x"}, format="json")
    assert no_key.status_code == 400
    missing = agent_client.post("/api/v1/alerts/999999/resolve", {"note": "x"}, format="json",
                                HTTP_IDEMPOTENCY_KEY="m-1")
    assert missing.status_code == 404 and missing.json()["type"].endswith("/not-found")


def test_who_may_see_and_handle_alerts(db, roleless_staff, token_client, client):
    alert = raise_alert()
    intern = session_client(roleless_staff)
    assert intern.get("/api/v1/alerts").status_code == 403
    assert ack(intern, alert).status_code == 403
    assert resolve(intern, alert, {"note": "x"}).status_code == 403
    token = token_client(scopes=("billing:read", "entitlements:read"))
    assert token.get("/api/v1/alerts").status_code == 403
    assert ack(token, alert, key="t-1").status_code == 403
    assert client.get("/api/v1/alerts").status_code == 401
    assert not AlertAction.objects.exists()


# --------------------------------------------------------------------------- API: the list


def test_open_alerts_newest_first_with_owner_and_trail(db, agent, agent_client):
    old = raise_alert(key="duplicate_charge:in_old", now=NOON - timedelta(hours=2))
    handled = raise_alert(AlertKind.FAILURE_RATE_SPIKE, "failure_rate_spike:2030-03-10", now=NOON - timedelta(hours=1))
    new = raise_alert(AlertKind.PAID_NOT_RESTORED, "paid_not_restored:in_new")
    ack(agent_client, old, {"note": "mine"})
    resolve(agent_client, handled, {"note": "card network outage, over"})

    listed = agent_client.get("/api/v1/alerts?open=true")

    assert listed.status_code == 200, listed.content
    rows = listed.json()["results"]
    assert [r["id"] for r in rows] == [new.pk, old.pk]
    assert rows[1]["owner"] == "agent" and [a["note"] for a in rows[1]["actions"]] == ["mine"]
    assert rows[0]["owner"] is None and rows[0]["needs_a_person"] is False
    assert rows[0]["title"] == "Paid but access not restored"
    closed = agent_client.get("/api/v1/alerts?open=false").json()["results"]
    assert [(r["id"], r["resolution_note"]) for r in closed] == [(handled.pk, "card network outage, over")]
    assert len(agent_client.get("/api/v1/alerts").json()["results"]) == 3
    spikes = agent_client.get("/api/v1/alerts?kind=FAILURE_RATE_SPIKE").json()["results"]
    assert [r["id"] for r in spikes] == [handled.pk]
    for bad in ("open=maybe", "kind=NOPE"):
        response = agent_client.get(f"/api/v1/alerts?{bad}")
        assert response.status_code == 400 and response.json()["errors"][0]["field"] == bad.split("=")[0]


# --------------------------------------------------------------------------- services and jobs


@pytest.mark.parametrize("kind", [AlertKind.DUPLICATE_CHARGE, AlertKind.FAILURE_RATE_SPIKE,
                                  AlertKind.RECONCILIATION_MISMATCH])
def test_a_job_may_not_resolve_what_only_a_person_can_see_is_over(db, agent, kind):
    alert = raise_alert(kind, f"{kind.lower()}:x")
    with pytest.raises(AlertRefused) as refused:
        alert_resolve(alert, by="job:alerts", now=NOON)
    assert refused.value.code == "NEEDS_A_PERSON"
    assert Alert.objects.get(pk=alert.pk).resolved_at is None and not AlertAction.objects.exists()
    person = alert_resolve(alert, by=agent, now=NOON, note="checked by hand")
    assert person.resolved_by == "agent" and trail(alert) == [("RESOLVE", "agent", "checked by hand", "")]


@pytest.fixture
def clock():
    with time_machine.travel(NOON, tick=True) as traveller:
        yield traveller


def success_fact(cycle, ref):
    return MonetaryFact.objects.create(
        kind=FactKind.PAYMENT_SUCCEEDED, invoice=cycle.invoice, cycle=cycle, amount=cycle.amount,
        currency=cycle.currency, provider_ref=ref, dedupe_key=f"t-success:{cycle.pk}:{ref}", occurred_at=NOON,
        recorded_at=NOON)


def run_alerts(now):
    record = job_run("alerts", now=now)
    assert record.status == "OK", record.detail
    return record


def test_a_duplicate_charge_stays_open_until_a_person_resolves_it_and_is_not_raised_again_for_the_same_charges(
        policy, clock, agent):
    cycle = open_cycle(make_subscription(), amount=4900)
    assert accept(cycle, "recover", evidence=paid_evidence(reload(cycle))).accepted
    cycle = reload(cycle)
    success_fact(cycle, "pi_first")
    success_fact(cycle, "pi_second")
    for minute in (1, 2, 3):
        run_alerts(NOON + timedelta(minutes=minute))
    (alert,) = Alert.objects.filter(kind=AlertKind.DUPLICATE_CHARGE)
    assert alert.resolved_at is None and alert.occurrences == 3, "the job never resolves it"

    alert_resolve(alert, by=agent, now=NOON + timedelta(minutes=4), note="refunded pi_second")
    record = run_alerts(NOON + timedelta(minutes=5))
    (alert,) = Alert.objects.filter(kind=AlertKind.DUPLICATE_CHARGE)
    assert alert.resolved_by == "agent" and alert.occurrences == 4, "the same charges: counted, not re-raised"
    assert record.changed == 0

    success_fact(cycle, "pi_third")
    run_alerts(NOON + timedelta(minutes=6))
    episodes = list(Alert.objects.filter(kind=AlertKind.DUPLICATE_CHARGE).order_by("pk"))
    assert len(episodes) == 2 and episodes[1].resolved_at is None, "a new charge is a new episode"
    assert episodes[1].figures["payment_refs"][-3:] == ["pi_first", "pi_second", "pi_third"]


def test_a_spike_a_person_resolved_is_not_raised_again_the_same_day(db, agent):
    key = "failure_rate_spike:2030-03-10"
    spike = raise_alert(AlertKind.FAILURE_RATE_SPIKE, key, figures={"today": {"rate": 0.4}})
    alert_resolve(spike, by=agent, now=NOON + timedelta(minutes=5), note="card network outage, over")
    later = raise_alert(AlertKind.FAILURE_RATE_SPIKE, key, figures={"today": {"rate": 0.3}},
                        now=NOON + timedelta(hours=1))
    assert later.pk == spike.pk and later.resolved_by == "agent" and later.occurrences == 2
    tomorrow = raise_alert(AlertKind.FAILURE_RATE_SPIKE, "failure_rate_spike:2030-03-11",
                           now=NOON + timedelta(days=1))
    assert tomorrow.pk != spike.pk and tomorrow.resolved_at is None


def test_the_job_resolves_a_paid_not_restored_alert_with_a_note_in_the_trail(policy, clock):
    cycle = open_cycle(make_subscription(), amount=4900)
    assert accept(cycle, "recover", evidence=paid_evidence(reload(cycle))).accepted
    alert = raise_alert(AlertKind.PAID_NOT_RESTORED, f"paid_not_restored:{cycle.invoice.provider_invoice_id}",
                        figures={"provider_invoice_id": cycle.invoice.provider_invoice_id}, invoice=cycle.invoice)
    run_alerts(NOON + timedelta(minutes=2))
    alert.refresh_from_db()
    assert alert.resolved_by == "job:alerts" and alert.resolution_note == "access restored"
    assert trail(alert) == [("RESOLVE", "job:alerts", "access restored", "")]


def test_an_unowned_unknown_payment_alert_clears_once_someone_owns_the_payment(db, agent):
    local_policy()
    walk = Walker(open_cycle(make_subscription(price="price_local"))).to_unknown()
    cycle = walk.cycle
    alert = raise_alert(AlertKind.UNKNOWN_UNOWNED, f"unknown-unowned:{cycle.cycle_id}", invoice=cycle.invoice,
                        subscription=cycle.subscription)
    run_alerts(NOON + timedelta(minutes=1))
    assert Alert.objects.get(pk=alert.pk).resolved_at is None, "still unknown and unowned"

    walk.step("assign_unknown_owner", owner=agent)
    assert walk.cycle.state == CycleState.PAYMENT_UNKNOWN
    run_alerts(NOON + timedelta(minutes=2))
    alert.refresh_from_db()
    assert alert.resolved_by == "job:alerts"
    assert trail(alert) == [("RESOLVE", "job:alerts", "the unknown payment is owned by agent", "")]


def test_the_alert_endpoints_are_in_the_published_schema(client, db):
    paths = client.get("/api/schema/", HTTP_ACCEPT="application/json").json()["paths"]
    assert paths["/api/v1/alerts"]["get"]["operationId"] == "alert_list"
    assert {p["name"] for p in paths["/api/v1/alerts"]["get"]["parameters"]} >= {"open", "kind", "cursor"}
    for action in ("acknowledge", "resolve"):
        operation = paths[f"/api/v1/alerts/{{alert_id}}/{action}"]["post"]
        assert operation["operationId"] == f"alert_{action}"
        assert {"200", "400", "403", "404", "409"} <= set(operation["responses"])
