"""Every bad PAYMENT-SIGNATURE of issue 18 gets a clear 4xx with its reason, and every request
is recorded (agentpay/api/request_log.py).

Unreadable (too large, not base64): 400, the intent stays challenged and the open challenge is
sent again. Readable but not a valid payment: 402 payment-invalid with the reason, the intent
rejected (seed: challenged --payload_invalid--> rejected), no new PAYMENT-REQUIRED (conformance
H10: a new payment needs a new key)."""

from __future__ import annotations

import base64
import time

import pytest
from eth_account import Account

from agentpay.api import onchain as gateway_onchain
from agentpay.models import ChainAuthorization, GatewayRequest, IntentReceipt, PaymentIntent
from agentpay.services.wallet_flow import Driven
from tests.agentpay_x402.buyer import decode, encode

pytestmark = pytest.mark.django_db
OTHER = "0x" + "77" * 20


@pytest.fixture(autouse=True)
def no_settlement(monkeypatch):
    monkeypatch.setattr(gateway_onchain, "intent_drive_onchain", lambda **kw: Driven(None))


def _edit(header: str, change) -> str:
    doc = decode(header)
    change(doc)
    return encode(doc)


def _auth(**fields):
    return lambda doc: doc["payload"]["authorization"].update(fields)


def _accepted(**fields):
    return lambda doc: doc["accepted"].update(fields)


def _now() -> int:
    return int(time.time())


# (case, how the buyer makes the header from the PAYMENT-REQUIRED, status, reason)
INVALID = [
    ("base64 that is not JSON", lambda b, r: base64.b64encode(b"not json {").decode(), "malformed_json"),
    ("a JSON array", lambda b, r: encode([1, 2]), "malformed_payload"),
    ("x402Version 1", lambda b, r: b.sign(r, version=1), "unsupported_x402_version"),
    ("no accepted requirements", lambda b, r: _edit(b.sign(r), lambda d: d.pop("accepted")), "malformed_payload"),
    ("scheme upto", lambda b, r: b.sign(r, accepted={"scheme": "upto"}), "unsupported_scheme"),
    ("another network", lambda b, r: b.sign(r, accepted={"network": "eip155:8453"}), "network_mismatch"),
    ("another asset", lambda b, r: b.sign(r, accepted={"asset": OTHER}), "asset_mismatch"),
    ("another payTo accepted", lambda b, r: b.sign(r, accepted={"payTo": OTHER}), "recipient_mismatch"),
    ("authorization to another recipient", lambda b, r: b.sign(r, to=OTHER), "recipient_mismatch"),
    ("a lower amount accepted", lambda b, r: b.sign(r, accepted={"amount": "1499999"}, value="1499999"),
     "amount_mismatch"),
    ("an authorization for less", lambda b, r: b.sign(r, value="1499999"), "amount_mismatch"),
    ("an authorization for more", lambda b, r: b.sign(r, value="1500001"), "amount_mismatch"),
    ("an expired window", lambda b, r: b.sign(r, valid_before=str(_now() - 1)), "authorization_expired"),
    ("a window closing within 6 s", lambda b, r: b.sign(r, valid_before=str(_now() + 3)), "authorization_expired"),
    ("a future window", lambda b, r: b.sign(r, valid_after=str(_now() + 120)), "authorization_not_yet_valid"),
    ("a window far past the challenge", lambda b, r: b.sign(r, valid_before=str(_now() + 3600)),
     "authorization_window_too_long"),
    ("signed by someone else", lambda b, r: b.sign(r, signer=Account.create()), "invalid_signature"),
    ("signed for another token name", lambda b, r: b.sign(r, domain={"name": "Fake Coin"}), "invalid_signature"),
    ("signed for another chain", lambda b, r: b.sign(r, domain={"chainId": 1}), "invalid_signature"),
    ("signed for another contract", lambda b, r: b.sign(r, domain={"verifyingContract": OTHER}), "invalid_signature"),
    ("a signature that is not hex", lambda b, r: _edit(b.sign(r), lambda d: d["payload"].update(signature="0xzz")),
     "malformed_payload"),
    ("a short nonce", lambda b, r: b.sign(r, nonce="0x1234"), "malformed_payload"),
    ("a value that is not a number", lambda b, r: _edit(b.sign(r), _auth(value="1.5e6")), "malformed_payload"),
    ("a Permit2 payload", lambda b, r: _edit(b.sign(r), lambda d: d.update(payload={"permit2Authorization": {}})),
     "malformed_payload"),
    ("a tampered authorization", lambda b, r: _edit(b.sign(r), _auth(validAfter="1")), "invalid_signature"),
]


@pytest.mark.parametrize("case,make,reason", INVALID, ids=[c[0] for c in INVALID])
def test_an_invalid_payment_is_402_with_its_reason_and_rejects_the_intent(call, chain_routes, buyer, nonce_state,
                                                                          case, make, reason):
    required = call("paid", "k-bad")["PAYMENT-REQUIRED"]
    answer = call("paid", "k-bad", payment_signature=make(buyer, required))
    body = answer.json()
    assert answer.status_code == 402, body
    assert body["type"].endswith("/payment-invalid") and body["reason"] == reason, body
    assert body["detail"] and "PAYMENT-REQUIRED" not in answer
    intent = PaymentIntent.objects.get(idempotency_key="k-bad")
    assert intent.state == "rejected" and not ChainAuthorization.objects.exists()
    receipt = IntentReceipt.objects.get(intent=intent, event="payload_invalid")
    assert receipt.data["reason"] == reason
    logged = GatewayRequest.objects.filter(idempotency_key="k-bad").order_by("received_at")
    assert [(r.answer_status, r.answer_problem) for r in logged] == [(402, "payment-required"),
                                                                     (402, "payment-invalid")]
    assert logged.last().headers["payment-signature"]  # the presented header is on record
    # A replay of the closed key says the same, and verifies nothing again.
    replay = call("paid", "k-bad", payment_signature=buyer.pay(required))
    assert replay.status_code == 402 and replay.json()["reason"] == reason


def test_a_nonce_the_token_has_seen_used_is_refused(call, chain_routes, buyer, nonce_state):
    required = call("paid", "k-used")["PAYMENT-REQUIRED"]
    signature = buyer.sign(required)
    nonce_state.used.add((buyer.address.lower(), decode(signature)["payload"]["authorization"]["nonce"]))
    answer = call("paid", "k-used", payment_signature=signature)
    assert answer.status_code == 402 and answer.json()["reason"] == "nonce_already_used"
    assert PaymentIntent.objects.get(idempotency_key="k-used").state == "rejected"


UNREADABLE = [
    ("not base64", "!!!not-base64!!!", "malformed_base64"),
    ("oversize", "A" * 9000, "header_too_large"),
]


@pytest.mark.parametrize("case,header,reason", UNREADABLE, ids=[c[0] for c in UNREADABLE])
def test_an_unreadable_header_is_400_and_leaves_the_challenge_open(call, chain_routes, buyer, nonce_state, case,
                                                                   header, reason):
    required = call("paid", "k-unread")["PAYMENT-REQUIRED"]
    answer = call("paid", "k-unread", payment_signature=header)
    assert answer.status_code == 400
    assert answer.json()["type"].endswith("/payment-signature-malformed") and answer.json()["reason"] == reason
    assert answer["PAYMENT-REQUIRED"] == required  # still challengeable: the same terms again
    assert PaymentIntent.objects.get(idempotency_key="k-unread").state == "challenged"
    assert GatewayRequest.objects.filter(idempotency_key="k-unread", answer_status=400).count() == 1
    # The agent can still pay under the same key.
    assert call("paid", "k-unread", payment_signature=buyer.pay(required)).status_code == 202
