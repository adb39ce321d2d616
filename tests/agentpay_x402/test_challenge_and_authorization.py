"""x402 at the gateway up to the authorization (issue 18): the 402 and its PAYMENT-REQUIRED,
a signed payment taken, replays, one authorization for one intent, and the challenge's 300 s.

The settlement driver is replaced by a recorder here (these tests stop at authorized); the
end-to-end tests (test_end_to_end.py) drive the real one on a real chain."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from x402.http.utils import decode_payment_required_header, decode_payment_response_header

from agentpay.api import onchain as gateway_onchain
from agentpay.bridge import api_access_for, trusted_now
from agentpay.jobs import agentpay_job_run
from agentpay.models import ChainAuthorization, GatewayRequest, IntentReceipt, PaymentChallenge, PaymentIntent
from agentpay.services.acceptance import intent_accept
from agentpay.services.intents import intent_open
from agentpay.services.onchain_authorize import onchain_challenge
from agentpay.services.results import Cause, Step
from agentpay.services.wallet_flow import Driven
from tests.agentpay_x402.buyer import decode
from tests.agentpay_x402.conftest import PAY_TO, TOKEN

pytestmark = pytest.mark.django_db


@pytest.fixture
def driven(monkeypatch):
    """Record the calls to the settlement driver; it leaves the intent as it is."""
    calls: list[str] = []

    def drive(*, intent, cause, access, request_id, wait_seconds=None):
        calls.append(intent.intent_id)
        return Driven(None)

    monkeypatch.setattr(gateway_onchain, "intent_drive_onchain", drive)
    return calls


def _intent(key: str) -> PaymentIntent:
    return PaymentIntent.objects.get(idempotency_key=key)


def test_an_unpaid_call_gets_402_with_a_payment_required_the_sdk_decodes(call, chain_routes, network):
    answer = call("paid", "k-402")  # no AgentPay-Rail: the route's only rail is the chain
    assert answer.status_code == 402
    assert answer.json()["type"].endswith("/payment-required")
    required = decode_payment_required_header(answer["PAYMENT-REQUIRED"])
    assert required.x402_version == 2
    assert required.resource.url == "http://testserver/agentpay/v1/routes/paid/run"
    [terms] = required.accepts
    assert (terms.scheme, terms.network, terms.amount, terms.max_timeout_seconds) == ("exact", "eip155:31337",
                                                                                     "1500000", 300)
    assert (terms.asset.lower(), terms.pay_to.lower()) == (TOKEN, PAY_TO)
    assert terms.extra == {"name": "USD Coin", "version": "2"}
    intent = _intent("k-402")
    assert intent.state == "challenged" and answer["AgentPay-Display-Status"] == "PAYMENT_REQUIRED"
    challenge = PaymentChallenge.objects.get(intent=intent)
    assert challenge.expires_at - challenge.issued_at == timedelta(seconds=300)
    assert challenge.amount == 1_500_000 and challenge.requirement == decode(answer["PAYMENT-REQUIRED"])
    # A replay without a signature is the same challenge, not a new one.
    again = call("paid", "k-402")
    assert again.status_code == 402 and again["PAYMENT-REQUIRED"] == answer["PAYMENT-REQUIRED"]
    assert PaymentChallenge.objects.filter(intent=intent).count() == 1
    assert GatewayRequest.objects.filter(idempotency_key="k-402", answer_status=402).count() == 2


def test_a_route_with_both_rails_takes_the_chain_only_when_asked(call, chain_routes):
    assert "PAYMENT-REQUIRED" not in call("both", "k-w")  # the wallet rail: never a fallback to the chain
    assert _intent("k-w").rail == "wallet"
    answer = call("both", "k-c", agentpay_rail="onchain")
    assert answer.status_code == 402 and "PAYMENT-REQUIRED" in answer
    assert _intent("k-c").rail == "onchain"


def test_a_route_without_an_active_network_is_503_and_opens_nothing(call, chain_routes, network):
    network.active = False
    network.save()
    answer = call("paid", "k-off")
    assert answer.status_code == 503 and answer.json()["type"].endswith("/rail-not-available")
    assert not PaymentIntent.objects.filter(idempotency_key="k-off").exists()


def test_a_payment_signed_by_the_sdk_client_is_authorized_with_its_authorization(call, chain_routes, buyer,
                                                                                 nonce_state, driven):
    required = call("paid", "k-pay")["PAYMENT-REQUIRED"]
    signature = buyer.pay(required)
    answer = call("paid", "k-pay", payment_signature=signature)
    intent = _intent("k-pay")
    assert intent.state == "authorized" and driven == [intent.intent_id]
    # Settlement not decided yet: 202 with the view, never 402.
    assert answer.status_code == 202 and "PAYMENT-REQUIRED" not in answer
    assert answer["Location"] == f"/agentpay/v1/intents/{intent.intent_id}"
    response = decode_payment_response_header(answer["PAYMENT-RESPONSE"])
    assert (response.success, response.error_reason, response.payer) == (False, "settlement_pending",
                                                                        buyer.address.lower())
    auth = ChainAuthorization.objects.get(intent=intent)
    sent = decode(signature)["payload"]["authorization"]
    assert (auth.payer, auth.pay_to, int(auth.value)) == (buyer.address.lower(), PAY_TO, 1_500_000)
    assert (auth.nonce, int(auth.valid_before)) == (sent["nonce"], int(sent["validBefore"]))
    assert auth.payload == decode(signature) and nonce_state.calls == 1
    receipts = list(IntentReceipt.objects.filter(intent=intent, line="intent").values_list("event", flat=True))
    assert receipts == ["opened", "challenge_issued", "payload_verified"]


def test_a_signature_without_a_prior_challenge_is_challenged_and_verified_in_one_request(call, chain_routes, buyer,
                                                                                        nonce_state, driven):
    terms = call("paid", "k-other")["PAYMENT-REQUIRED"]  # the agent learnt the terms on another key
    answer = call("paid", "k-direct", payment_signature=buyer.pay(terms))
    intent = _intent("k-direct")
    assert answer.status_code == 202 and intent.state == "authorized"
    events = list(IntentReceipt.objects.filter(intent=intent, line="intent").values_list("event", "to_state"))
    assert events == [("opened", "created"), ("challenge_issued", "challenged"), ("payload_verified", "authorized")]
    assert PaymentChallenge.objects.filter(intent=intent).exists()


def test_replays_of_an_authorized_key_resume_and_never_verify_again(call, chain_routes, buyer, nonce_state, driven):
    signature = buyer.pay(call("paid", "k-r")["PAYMENT-REQUIRED"])
    assert call("paid", "k-r", payment_signature=signature).status_code == 202
    same = call("paid", "k-r", payment_signature=signature)
    bare = call("paid", "k-r")
    assert (same.status_code, bare.status_code) == (202, 202)
    assert len(driven) == 3 and nonce_state.calls == 1  # resumed three times, read the nonce once
    other = call("paid", "k-r", payment_signature=buyer.pay(call("paid", "k-r2")["PAYMENT-REQUIRED"]))
    assert other.status_code == 422 and other.json()["type"].endswith("/idempotency-key-reused")
    assert ChainAuthorization.objects.filter(intent=_intent("k-r")).count() == 1 and len(driven) == 3


def test_one_authorization_cannot_pay_a_second_intent(call, chain_routes, buyer, nonce_state, driven):
    signature = buyer.pay(call("paid", "k-a")["PAYMENT-REQUIRED"])
    assert call("paid", "k-a", payment_signature=signature).status_code == 202
    call("paid", "k-b")
    answer = call("paid", "k-b", payment_signature=signature)
    assert answer.status_code == 402 and answer.json()["reason"] == "nonce_already_used"
    assert "PAYMENT-REQUIRED" not in answer and _intent("k-b").state == "rejected"
    assert ChainAuthorization.objects.count() == 1


def test_the_unique_constraint_refuses_a_second_intent_even_past_the_checks(call, chain_routes, buyer, nonce_state,
                                                                            driven):
    """Two requests racing past the database pre-check: the acceptance's insert decides."""
    signature = buyer.pay(call("paid", "k-1st")["PAYMENT-REQUIRED"])
    call("paid", "k-1st", payment_signature=signature)
    call("paid", "k-2nd")
    second = _intent("k-2nd")
    outcome = intent_accept(intent_id=second.intent_id, cause=Cause.system("race"), steps=[Step(
        "intent", "payload_verified", {"payment_payload": decode(signature), "authorization_state": "unused"})])
    assert not outcome.accepted and outcome.refusal_code == "NONCE_ALREADY_USED"
    assert outcome.lines.intent == "challenged"


def test_payload_verified_needs_the_nonce_state_read_first(call, chain_routes, buyer):
    signature = buyer.pay(call("paid", "k-ns")["PAYMENT-REQUIRED"])
    outcome = intent_accept(intent_id=_intent("k-ns").intent_id, cause=Cause.system("t"), steps=[Step(
        "intent", "payload_verified", {"payment_payload": decode(signature)})])
    assert outcome.refusal_code == "NONCE_STATE_UNCHECKED"


def test_the_node_not_answering_decides_nothing(call, chain_routes, buyer, nonce_state, driven):
    signature = buyer.pay(call("paid", "k-down")["PAYMENT-REQUIRED"])
    nonce_state.down = True
    answer = call("paid", "k-down", payment_signature=signature)
    assert answer.status_code == 503 and answer.json()["type"].endswith("/chain-unavailable")
    assert _intent("k-down").state == "challenged"
    nonce_state.down = False
    assert call("paid", "k-down", payment_signature=signature).status_code == 202
    assert _intent("k-down").state == "authorized"


def test_a_frozen_tenant_is_denied_before_any_challenge(call, chain_routes, tenant):
    tenant.status = "frozen"
    tenant.save()
    answer = call("paid", "k-frozen")
    assert answer.status_code == 403 and "PAYMENT-REQUIRED" not in answer
    assert _intent("k-frozen").state == "rejected"


def _challenged_at(tenant, route, key: str, at):
    opened = intent_open(tenant=tenant, route=route, rail="onchain", idempotency_key=key, digest="d", forward_path="",
                         forward_query="", content_type="", body=b"", request_id=uuid.uuid4(), now=at)
    assert onchain_challenge(intent=opened.intent, cause=Cause.system("t"), resource="r",
                             access=api_access_for("", method="POST"), now=at).accepted
    return opened.intent


def test_the_challenge_expires_at_300_seconds_by_the_job(tenant, chain_routes):
    t0 = trusted_now() - timedelta(seconds=400)
    intent = _challenged_at(tenant, chain_routes["paid"], "k-ttl", t0)
    early = agentpay_job_run("agentpay_challenge_expiry", now=t0 + timedelta(seconds=299))
    intent.refresh_from_db()
    assert intent.state == "challenged" and early.changed == 0
    due = agentpay_job_run("agentpay_challenge_expiry", now=t0 + timedelta(seconds=300))
    intent.refresh_from_db()
    assert intent.state == "expired" and due.changed == 1


def test_a_payment_after_the_ttl_expires_the_challenge_instead(call, tenant, chain_routes, buyer, nonce_state):
    required = call("paid", "k-fresh")["PAYMENT-REQUIRED"]
    stale = _challenged_at(tenant, chain_routes["paid"], "k-stale", trusted_now() - timedelta(seconds=301))
    stale.request_digest = PaymentIntent.objects.get(idempotency_key="k-fresh").request_digest
    PaymentIntent.objects.filter(pk=stale.pk).update(request_digest=stale.request_digest)
    answer = call("paid", "k-stale", payment_signature=buyer.pay(required))
    assert answer.status_code == 402 and answer.json()["type"].endswith("/challenge-expired")
    assert _intent("k-stale").state == "expired" and nonce_state.calls == 0
    assert not ChainAuthorization.objects.exists()


def test_the_published_schema_names_the_x402_header_and_the_202(client):
    schema = client.get("/agentpay/v1/schema/", HTTP_ACCEPT="application/json").json()
    call_op = schema["paths"]["/agentpay/v1/routes/{route}/{subpath}"]["post"]
    assert "PAYMENT-SIGNATURE" in {p["name"] for p in call_op["parameters"]}
    assert {"202", "402", "503"} <= set(call_op["responses"]) and "501" not in call_op["responses"]


def test_a_402_for_a_fresh_key_is_one_transaction_that_reads_nothing_back(call, chain_routes, network):
    assert call("paid", "k-warm").status_code == 402
    with CaptureQueriesContext(connection) as captured:
        assert call("paid", "k-fresh").status_code == 402
    sql = [q["sql"] for q in captured.captured_queries]
    statements = [s for s in sql if s.startswith(("INSERT", "UPDATE", "SELECT", "WITH"))]
    # The key, its tenant, the route and its network in one read (agentpay/api/front.py); the open
    # in one statement (agentpay/services/open_writes.py): intent, settlement, fulfillment,
    # challenge, both receipts, the outbox row and the request's log row with its answer (the 402
    # is known before the open: no UPDATE after it).
    assert len(statements) == 2, "\n".join(s[:100] for s in sql)
    front, open_ = statements
    assert front.startswith("SELECT") and all(f'"{t}"' in front for t in (
        "agentpay_tenantapikey", "agentpay_tenant", "agentpay_pricedroute", "agentpay_chainnetwork"))
    inserted = re.findall(r'INSERT INTO "(\w+)"', open_)
    assert open_.startswith("WITH") and inserted == [
        "agentpay_paymentintent", "agentpay_settlement", "agentpay_fulfillment", "agentpay_paymentchallenge",
        "agentpay_gatewayrequest", "agentpay_intentreceipt", "agentpay_intentreceipt", "agentpay_outboxmessage"], \
        open_[:300]
    row = GatewayRequest.objects.get(idempotency_key="k-fresh")
    assert (row.answer_status, row.answer_problem, row.intent.idempotency_key) == (402, "payment-required", "k-fresh")
    assert row.answered_at is not None and row.duration_ms is not None and row.tenant_id and row.route_id
    assert not [s for s in sql if "FOR UPDATE" in s]  # nothing to lock: the rows are this transaction's
    assert len([s for s in sql if s.startswith("SAVEPOINT")]) == 1  # one transaction (a savepoint in a test)


def _rows(intent: PaymentIntent) -> dict:
    """What an intent's challenge left, without the ids and times that differ between two intents."""
    intent.refresh_from_db()
    outbox = [dict(m.payload, intent_id="", request_id="", actor="") for m in intent.outbox_messages.order_by("pk")]
    return {
        "intent": (intent.state, intent.generation, intent.challenged_at is not None,
                   intent.processing_until is None),
        "receipts": list(IntentReceipt.objects.filter(intent=intent).order_by("pk").values_list(
            "line", "event", "accepted", "from_state", "to_state", "generation", "cause_kind")),
        "outbox": [(p.pop("generation"), p) for p in outbox],
        "challenge": PaymentChallenge.objects.filter(intent=intent).values_list("amount", "asset", "pay_to").get(),
        "lines": (intent.settlements.get().state, intent.fulfillment.state),
    }


def test_the_challenge_on_open_leaves_what_the_challenge_issued_acceptance_leaves(tenant, chain_routes):
    route, now = chain_routes["paid"], trusted_now()

    def open_(key: str, steps: list[Step]):
        return intent_open(tenant=tenant, route=route, rail="onchain", idempotency_key=key, digest="d",
                           forward_path="run", forward_query="", content_type="", body=b"", request_id=uuid.uuid4(),
                           now=now, steps=steps, lease=False).intent

    folded = open_("k-folded", [Step("intent", "challenge_issued", {"resource": "http://testserver/r"})])
    accepted = open_("k-accepted", [])
    assert accepted.state == "created"
    assert onchain_challenge(intent=accepted, cause=Cause.request(uuid.uuid4(), tenant.tenant_id),
                             access=api_access_for("", method="POST"), resource="http://testserver/r").accepted
    assert _rows(folded) == _rows(accepted)
    assert _rows(folded)["intent"] == ("challenged", 1, True, True)
    assert PaymentChallenge.objects.get(intent=folded).requirement == \
        PaymentChallenge.objects.get(intent=accepted).requirement


def test_a_route_whose_network_cannot_take_the_intent_is_opened_created_and_refused_by_the_acceptance(
        call, tenant, chain_routes, network):
    network.currency = "eur"  # the token is not the route's currency: no challenge on open
    network.save()
    opened = intent_open(tenant=tenant, route=chain_routes["paid"], rail="onchain", idempotency_key="k-eur",
                         digest="d", forward_path="", forward_query="", content_type="", body=b"",
                         request_id=uuid.uuid4(), now=trusted_now(),
                         steps=[Step("intent", "challenge_issued", {"resource": "r"})])
    assert opened.intent.state == "created" and opened.intent.generation == 0  # the effect refused: rolled back
    assert list(IntentReceipt.objects.filter(intent=opened.intent).values_list("event", flat=True)) == ["opened"]
    assert not PaymentChallenge.objects.filter(intent=opened.intent).exists()
    answer = call("paid", "k-eur-call")
    assert answer.status_code == 503 and "PAYMENT-REQUIRED" not in answer
    refused = IntentReceipt.objects.get(intent__idempotency_key="k-eur-call", accepted=False)
    assert (refused.event, refused.refusal_code) == ("challenge_issued", "NO_CHAIN_NETWORK")


def test_only_the_steps_of_an_open_are_taken_on_open(tenant, chain_routes):
    with pytest.raises(ValueError):
        intent_open(tenant=tenant, route=chain_routes["paid"], rail="onchain", idempotency_key="k-no", digest="d",
                    forward_path="", forward_query="", content_type="", body=b"", request_id=uuid.uuid4(),
                    now=trusted_now(), steps=[Step("intent", "payload_invalid", {"reason": "x"})])
    assert not PaymentIntent.objects.filter(idempotency_key="k-no").exists()
