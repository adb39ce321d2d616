"""The conformance runner (issue 17 item 6): the hand-written state-machine.json against the code.

- The file is valid against its JSON Schema, and its tables are the code's, row by row.
- Every wallet vector runs through the real acceptance service on PostgreSQL (given built by
  real events, see conformance_world), event by event: accepted or refused, with the refusal's
  class and guard; then the three states, the display status, the wallet and the ledger.
- Every wallet vector with an HTTP answer runs again through the gateway (Django test client,
  loopback upstream): the answer, its problem type and headers, and the events the request took.
- Coverage both ways: every coded transition has a vector, and every (state, event) pair not
  listed is refused by the service, in every reachable wallet configuration.
- On-chain vectors: here checked against the tables; through the service in
  test_conformance_onchain.py.
"""

from __future__ import annotations

import socket

import jsonschema
import pytest

from agentpay.api.auth import tenant_api_key_create
from agentpay.bridge import trusted_now
from agentpay.composite import PAIRS
from agentpay.models import GatewayRequest, IntentReceipt, LedgerAccount, PaymentIntent
from agentpay.selectors import intent_display_status
from agentpay.services.intents import intent_claim_lease, intent_release_lease
from agentpay.states import INITIAL, ROWS, TERMINAL, TRANSITIONS, Lines, events_of, states_of, step_verdict
from tests.agentpay import conformance_world as cw
from tests.support.actors import AGENTS, make_user, role

pytestmark = pytest.mark.django_db


@pytest.fixture
def actors(lead, django_user_model) -> cw.Actors:
    agent = make_user("agent", password=None, staff=True)
    agent.groups.add(role(AGENTS))
    assert not agent.has_perm("agentpay.resolve_review")
    return cw.Actors(lead=lead, agent=agent)


# ---------------------------------------------------------------- the file and the tables


def test_the_file_is_valid_against_its_schema():
    validator = jsonschema.validators.validator_for(cw.SCHEMA)
    validator.check_schema(cw.SCHEMA)
    errors = sorted(validator(cw.SCHEMA).iter_errors(cw.SPEC), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors[:10])
    ids = [v["id"] for v in cw.VECTORS]
    assert len(ids) == len(set(ids)), "vector ids are unique"


def test_the_tables_in_states_py_are_the_files():
    for spec_line, spec in cw.SPEC["lines"].items():
        line = cw.LINE[spec_line]
        assert set(spec["states"]) == set(states_of(line)), line
        assert spec["initial"] == INITIAL[line]
        assert set(spec["terminal"]) == set(TERMINAL[line]), line
        rows = {(t["from"], t["event"]): t for t in spec["transitions"]}
        assert {k: t["to"] for k, t in rows.items()} == TRANSITIONS[line], line
        for (state, event), t in rows.items():
            guard, rails = ROWS[(line, state, event)]
            assert (guard, set(rails)) == (t["guard"]["name"], set(t["rails"])), t["id"]
    assert len(ROWS) == sum(len(t) for t in TRANSITIONS.values())


def _walk() -> set[Lines]:
    """Every (rail, intent, settlement, fulfillment) the tables and the cross-line guards reach."""
    seen: set[Lines] = set()
    todo = [Lines(rail, "created", "not_started", "not_started") for rail in ("wallet", "onchain")]
    while todo:
        lines = todo.pop()
        if lines in seen:
            continue
        seen.add(lines)
        for line, table in TRANSITIONS.items():
            for (state, event), to in table.items():
                if state == lines.state(line) and any(step_verdict(lines, line, event, manual=m).allowed
                                                      for m in (False, True)):
                    todo.append(lines.moved(line, to))
    return seen


def test_the_composite_view_is_the_files_and_names_exactly_the_reachable_combinations():
    spec_pairs = {(p["rail"], p["settlement"], p["fulfillment"], i): p["display_status"]
                  for p in cw.SPEC["composite_view"]["pairs"] for i in p["intent_states"]}
    code_pairs = {(rail, s, f, i): status for (rail, s, f), entries in PAIRS.items() for intents, status in entries
                  for i in intents}
    assert code_pairs == spec_pairs
    reachable = {(x.rail, x.settlement, x.fulfillment, x.intent) for x in _walk()}
    assert reachable == set(spec_pairs), (f"reachable, unnamed: {sorted(reachable - set(spec_pairs))}; "
                                          f"named, unreachable: {sorted(set(spec_pairs) - reachable)}")


def _replayed(vector) -> list[tuple[str, str, str]]:
    """(line, from, event) of each accepted event of a vector, replayed on the tables alone."""
    state = {cw.LINE[k]: vector["given"][k2] for k, k2 in (("payment_intent", "intent"), ("settlement", "settlement"),
                                                           ("fulfillment", "fulfillment"))}
    taken = []
    for e in vector["events"]:
        if e["line"] not in cw.LINE or e["result"] != "accepted":
            continue
        line = cw.LINE[e["line"]]
        taken.append((line, state[line], e["event"]))
        state[line] = TRANSITIONS[line][(state[line], e["event"])]
    return taken


def test_every_coded_transition_has_a_vector():
    covered = {t for v in cw.VECTORS for t in _replayed(v)}
    wallet_covered = {t for v in cw.WALLET_VECTORS for t in _replayed(v)}
    assert set(ROWS) - covered == set()
    assert {r for r, (_, rails) in ROWS.items() if "wallet" in rails} - wallet_covered == set()


def test_the_onchain_vectors_are_well_formed():
    """They run through the service in test_conformance_onchain.py; here, against the tables."""
    vectors = cw.ONCHAIN_VECTORS
    assert len(vectors) > 0
    lines_ok = set(cw.LINE) | {"gateway"}
    for v in vectors:
        for spec_line, key in (("payment_intent", "intent"), ("settlement", "settlement"),
                               ("fulfillment", "fulfillment")):
            assert v["given"][key] in states_of(cw.LINE[spec_line]), v["id"]
        for e in v["events"]:
            assert e["line"] in lines_ok, v["id"]
            if e["line"] in cw.LINE:
                assert e["event"] in events_of(cw.LINE[e["line"]]), (v["id"], e["event"])
        _replayed(v)  # every accepted event is a row of the tables from the state it meets


# ---------------------------------------------------------------- vectors through the service


def _check_end(vector, built: cw.Built) -> None:
    expect, intent = vector["expect"], built.intent
    assert cw.lines_now(intent) == {k: expect[k] for k in ("intent", "settlement", "fulfillment")}, vector["id"]
    assert intent_display_status(intent) == expect["display_status"], vector["id"]
    if "wallet" in expect:
        counters = cw.wallet_counters(built.wallet)
        assert {k: counters[k] for k in expect["wallet"] if k in counters} == {
            k: v for k, v in expect["wallet"].items() if k in counters}, vector["id"]
    if "ledger" in expect:
        assert cw.ledger_of(intent) == expect["ledger"], vector["id"]


@pytest.mark.parametrize("vector", cw.WALLET_VECTORS, ids=lambda v: v["id"])
def test_wallet_vector_through_the_acceptance_service(vector, actors, upstream):
    clock = cw.Clock()
    built = cw.build(vector, actors, clock, base_url=upstream.base_url)
    intent = built.intent
    assert cw.lines_now(intent) == {k: vector["given"][k] for k in ("intent", "settlement", "fulfillment")}
    for n, e in enumerate(vector["events"]):
        if e["line"] == "gateway":
            continue  # an HTTP request: test_wallet_vector_through_the_gateway
        data = e.get("data", {})
        before = intent.generation
        receipts = IntentReceipt.objects.filter(intent=intent).count()
        outcome = cw.accept(intent, cw.LINE[e["line"]], e["event"], data, cause=actors.cause(data),
                            now=cw.event_time(intent, data, clock))
        where = f"{vector['id']} event {n} {e['line']}.{e['event']}: {outcome.refusal_code} {outcome.detail}"
        assert outcome.accepted == (e["result"] == "accepted"), where
        assert IntentReceipt.objects.filter(intent=intent).count() == receipts + 1, where
        if not outcome.accepted:
            intent.refresh_from_db()
            assert intent.generation == before, where  # a refusal changes nothing
            assert outcome.refusal == e["refusal"], where
            if "guard" in e:
                assert outcome.guard == e["guard"], where
        intent.refresh_from_db()
    _check_end(vector, built)


# ---------------------------------------------------------------- vectors through the gateway


def _closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def _upstream_for(vector, upstream) -> tuple[str, str, tuple[float, float]]:
    """(base url, path, timeouts) of an upstream that answers as the vector's first observation."""
    for e in vector["events"]:
        data = e.get("data", {})
        if e["event"] == "upstream_timeout":
            cause = data.get("cause")
            if cause == "read_timeout":
                return upstream.base_url, "/hang", (1.0, 0.5)
            if cause == "body_truncated":
                return upstream.base_url, "/drop", (1.0, 5.0)
            if cause == "connect_error":
                return _closed_port_url(), "/code/200", (0.5, 1.0)
        if e["event"] in ("upstream_2xx", "upstream_4xx", "upstream_5xx"):
            return upstream.base_url, f"/code/{data['status']}", (1.0, 5.0)
    return upstream.base_url, "/code/200", (1.0, 5.0)


def _deny_api_tokens(tenant, request) -> None:
    """Link the tenant to a subscription whose entitlement profile allows no API calls (seed 003's
    arrears freeze): the gateway reads it through agentpay.bridge."""
    from tests.support.builders import make_subscription

    request.getfixturevalue("policy")
    subscription = make_subscription()
    subscription.entitlement_profile = "SUSPENDED"  # api_tokens: none
    subscription.save(update_fields=["entitlement_profile"])
    tenant.subscription_ref = subscription.provider_subscription_id
    tenant.save(update_fields=["subscription_ref"])


HTTP_VECTORS = [v for v in cw.WALLET_VECTORS if v["expect"].get("http_status") is not None]
GATEWAY_REFUSAL = {409: "idempotency_in_flight", 422: "idempotency_key_reused", 200: "idempotency_replay"}


def _accepted(vector) -> list[tuple[str, str]]:
    return [(cw.LINE[e["line"]], e["event"]) for e in vector["events"] if e["line"] in cw.LINE
            and e["result"] == "accepted"]


@pytest.mark.parametrize("vector", HTTP_VECTORS, ids=lambda v: v["id"])
def test_wallet_vector_through_the_gateway(vector, actors, upstream, client, request):
    """The agent's request in which the vector's first event happens, from `created` (the
    gateway drives every intent it opens from there), or, for a key that already has its intent
    (`given.idempotency`), the second request with that key."""
    clock, expect = cw.Clock(), vector["expect"]
    base_url, path, timeouts = _upstream_for(vector, upstream)
    gateway_event = next((e for e in vector["events"] if e["line"] == "gateway"), None)
    built = cw.build(vector, actors, clock, base_url=base_url, route_path=path, route_timeouts=timeouts,
                     open_intent=gateway_event is not None)
    body, key = built.body, built.key
    if gateway_event is not None:
        if vector["given"]["idempotency"]["in_flight"]:
            assert intent_claim_lease(intent=built.intent, now=trusted_now())
        else:
            intent_release_lease(intent=built.intent)
        if gateway_event["data"]["request_digest"] != vector["given"]["idempotency"]["request_digest"]:
            body = body + b" "
    if any(e.get("data", {}).get("reason") == "entitlement_denies_api_tokens" for e in vector["events"]):
        _deny_api_tokens(built.tenant, request)
    raw = tenant_api_key_create(tenant=built.tenant, label="conformance")[1]
    calls_before = len(upstream.calls)
    response = client.post(f"/agentpay/v1/routes/{built.route.slug}/run", data=body, content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {raw}", HTTP_IDEMPOTENCY_KEY=key)
    where = f"{vector['id']}: {response.status_code} {response.content[:300]!r}"
    assert response.status_code == expect["http_status"], where
    if "problem_type" in expect:
        assert response.json()["type"] == expect["problem_type"], where
    for header in expect.get("headers_present", []):
        assert response.has_header(header), where
    for header in expect.get("headers_absent", []):
        assert not response.has_header(header), where
    intent = PaymentIntent.objects.get(tenant=built.tenant, idempotency_key=key)
    if gateway_event is not None:
        assert GATEWAY_REFUSAL[response.status_code] == gateway_event["refusal"], where
        assert PaymentIntent.objects.filter(tenant=built.tenant, idempotency_key=key).count() == expect[
            "intents_for_key"]
        assert len(upstream.calls) == calls_before, "a replay or a refusal never calls the upstream"
        _check_end(vector, cw.Built(built.tenant, built.route, intent, built.wallet, key, body))
        return
    request_id = GatewayRequest.objects.get(request_id=response["X-Request-Id"]).request_id
    taken = [(r.line, r.event) for r in IntentReceipt.objects.filter(intent=intent, request_id=request_id,
                                                                     accepted=True).exclude(event="opened")
             .order_by("pk")]
    wanted = _accepted(vector)
    # The request's events end with the vector's first events (a vector given mid-way starts
    # where the request already was), or are all of them.
    k = max((n for n in range(1, len(wanted) + 1) if taken[-n:] == wanted[:n]), default=0)
    if vector["given"]["intent"] == "created":
        k = len(taken) if taken == wanted[:len(taken)] else 0
    assert k >= 1, f"{where}: the request took {taken}, the vector starts {wanted}"
    if k == len(wanted):
        built.intent = intent
        _check_end(vector, built)
    if path.startswith("/code/") and not any(e == "dispatch" for _, e in taken):
        assert len(upstream.calls) == calls_before, "no upstream call without a dispatch"


# ---------------------------------------------------------------- every unlisted pair is refused


WALLET_CONFIGS = sorted({(i, s, f) for (rail, s, f), entries in PAIRS.items() if rail == "wallet"
                         for intents, _ in entries for i in intents})


@pytest.mark.parametrize(("intent_state", "settlement", "fulfillment"), WALLET_CONFIGS,
                         ids=["/".join(c) for c in WALLET_CONFIGS])
def test_every_unlisted_pair_is_refused(intent_state, settlement, fulfillment, actors, upstream):
    """In each reachable wallet configuration (built by real events), every event of every line
    that is not a row from the line's state, or is a row of the on-chain rail only, is refused
    by the service, and nothing moves."""
    given = {"intent": intent_state, "settlement": settlement, "fulfillment": fulfillment}
    clock = cw.Clock()
    built = cw.build({"id": "GRID", "rail": "wallet", "given": given, "events": [], "expect": {}}, actors, clock,
                     base_url=upstream.base_url)
    intent, tried = built.intent, 0
    for line in TRANSITIONS:
        state = given[line]
        for event in events_of(line):
            row = ROWS.get((line, state, event))
            if row is not None and "wallet" in row[1]:
                continue
            outcome = cw.accept(intent, line, event, cause=actors.cause({}), now=clock.tick())
            assert not outcome.accepted, (line, state, event)
            assert outcome.refusal in ("terminal_state", "rail_mismatch", "no_transition"), (line, state, event,
                                                                                               outcome.refusal_code)
            tried += 1
    assert tried > 0
    assert cw.lines_now(intent) == given
    assert LedgerAccount.objects.get(pk=built.wallet.pk).available == cw.wallet_counters(built.wallet)["available"]
