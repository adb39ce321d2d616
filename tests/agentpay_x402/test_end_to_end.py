"""The paid call end to end on a real chain (chain's `chain` fixture: anvil, or eth-tester said
loudly): 402 → the buyer signs with the SDK client (eth_account) → the paid call settles on
chain (settle's intent_drive_onchain) → the upstream answers → 200 + PAYMENT-RESPONSE with the
transaction hash. A settlement not confirmed when the wait ends is a 202 — never a 402 — and the
replay of the same key finishes it without a second payment."""

from __future__ import annotations

import pytest
from eth_account import Account
from x402.http.utils import decode_payment_response_header

from agentpay.chain.token import transfer_with_authorization_calldata
from agentpay.models import ChainTransaction, PaymentIntent, PricedRoute, RefundObligation
from tests.agentpay_x402.buyer import Buyer, decode

pytestmark = pytest.mark.django_db(transaction=True)
PRICE = 150  # cents: 1_500_000 atomic units of a 6-decimal token


@pytest.fixture
def network(chain, db):
    return chain.make_network()


def _route(network, upstream, slug: str, path: str) -> PricedRoute:
    return PricedRoute.objects.create(
        slug=slug, name=slug, upstream_base_url=upstream.base_url, upstream_path=path, method="POST",
        price_minor=PRICE, currency="usd", rails_allowed=["onchain"], connect_timeout_seconds=1.0,
        read_timeout_seconds=5.0, status_query_url=f"{upstream.base_url}/status", network=network)


@pytest.fixture
def paid_route(network, upstream):
    return _route(network, upstream, "paid", "/ok")


@pytest.fixture
def payer(chain):
    return Buyer(Account.from_key(chain.payers[0].key))


def test_a_paid_call_settles_on_chain_then_reaches_the_upstream(chain, call, paid_route, payer, upstream):
    before = (chain.balance(payer.address), chain.balance(chain.pay_to.address))
    required = call("paid", "k-e2e")
    assert required.status_code == 402 and not upstream.calls
    answer = call("paid", "k-e2e", payment_signature=payer.pay(required["PAYMENT-REQUIRED"]))
    assert answer.status_code == 200, answer.content
    intent = PaymentIntent.objects.get(idempotency_key="k-e2e")
    tx = ChainTransaction.objects.get(settlement__intent=intent)
    response = decode_payment_response_header(answer["PAYMENT-RESPONSE"])
    assert (response.success, response.transaction, response.network) == (True, tx.tx_hash, "eip155:31337")
    assert response.payer == payer.address.lower()
    assert chain.wait_receipt(tx.tx_hash)["status"] in (1, "0x1")
    assert intent.state == "completed" and answer["AgentPay-Display-Status"] == "COMPLETED"
    assert len(upstream.calls) == 1
    after = (chain.balance(payer.address), chain.balance(chain.pay_to.address))
    assert (before[0] - after[0], after[1] - before[1]) == (1_500_000, 1_500_000)
    # The replay shows the same payment; nothing is sent or paid again.
    replay = call("paid", "k-e2e", payment_signature=payer.pay(required["PAYMENT-REQUIRED"]))
    assert replay.status_code == 422  # a different signature on a paid key is refused, not verified
    again = call("paid", "k-e2e")
    assert again.status_code == 200 and again["Idempotent-Replayed"] == "true"
    assert decode_payment_response_header(again["PAYMENT-RESPONSE"]).transaction == tx.tx_hash
    assert ChainTransaction.objects.count() == 1 and len(upstream.calls) == 1
    assert chain.balance(payer.address) == after[0]


def test_a_settlement_still_pending_when_the_wait_ends_is_202_never_402(chain, call, paid_route, payer, upstream,
                                                                       settings):
    chain.require_anvil("pausing the mining")
    settings.AGENTPAY_ONCHAIN_WAIT_SECONDS = 0.5
    before = chain.balance(payer.address)
    signature = payer.pay(call("paid", "k-slow")["PAYMENT-REQUIRED"])
    chain.set_automine(False)
    answer = call("paid", "k-slow", payment_signature=signature)
    assert answer.status_code == 202, answer.content
    assert "PAYMENT-REQUIRED" not in answer and answer["Location"].startswith("/agentpay/v1/intents/pi_")
    intent = PaymentIntent.objects.get(idempotency_key="k-slow")
    tx = ChainTransaction.objects.get(settlement__intent=intent)
    response = decode_payment_response_header(answer["PAYMENT-RESPONSE"])
    assert (response.success, response.error_reason, response.transaction) == (False, "settlement_pending",
                                                                               tx.tx_hash)
    assert answer.json()["display_status"] == "SETTLEMENT_IN_PROGRESS" and not upstream.calls
    chain.mine()
    chain.set_automine(True)
    done = call("paid", "k-slow", payment_signature=signature)  # the same key, the same signature: resume
    assert done.status_code == 200, done.content
    assert decode_payment_response_header(done["PAYMENT-RESPONSE"]).transaction == tx.tx_hash
    assert ChainTransaction.objects.count() == 1 and len(upstream.calls) == 1
    assert before - chain.balance(payer.address) == 1_500_000


def test_an_authorization_already_used_on_chain_is_refused_at_the_gateway(chain, call, paid_route, payer):
    signature = payer.pay(call("paid", "k-spent")["PAYMENT-REQUIRED"])
    auth = decode(signature)["payload"]
    # Someone else submits the same signed authorization first, straight to the token.
    spent = chain.send(chain.deployer, to=chain.token_address, data=transfer_with_authorization_calldata(
        {**auth["authorization"], "signature": auth["signature"]}))
    assert chain.wait_receipt(spent)["status"] in (1, "0x1")
    answer = call("paid", "k-spent", payment_signature=signature)
    assert answer.status_code == 402 and answer.json()["reason"] == "nonce_already_used"
    assert PaymentIntent.objects.get(idempotency_key="k-spent").state == "rejected"
    assert not ChainTransaction.objects.exists()


def test_paid_then_the_upstream_refuses_relays_its_4xx_and_says_a_refund_is_owed(chain, call, network, upstream,
                                                                                payer):
    _route(network, upstream, "refused", "/bad")
    answer = call("refused", "k-4xx", payment_signature=payer.pay(call("refused", "k-4xx")["PAYMENT-REQUIRED"]))
    assert answer.status_code == 422 and answer.json() == {"error": "bad input"}  # the upstream's own answer
    assert answer["AgentPay-Refund"] == "required"
    assert answer["AgentPay-Display-Status"] == "SETTLED_FULFILLMENT_FAILED_REFUND_REQUIRED"
    assert decode_payment_response_header(answer["PAYMENT-RESPONSE"]).success is True
    intent = PaymentIntent.objects.get(idempotency_key="k-4xx")
    assert RefundObligation.objects.filter(intent=intent, payer=payer.address.lower()).exists()


def test_paid_then_the_upstream_fails_is_502_fulfillment_unknown_and_never_called_again(chain, call, network,
                                                                                       upstream, payer):
    _route(network, upstream, "boom", "/boom")
    signature = payer.pay(call("boom", "k-5xx")["PAYMENT-REQUIRED"])
    answer = call("boom", "k-5xx", payment_signature=signature)
    assert answer.status_code == 502 and answer.json()["type"].endswith("/fulfillment-unknown")
    assert decode_payment_response_header(answer["PAYMENT-RESPONSE"]).success is True
    replay = call("boom", "k-5xx", payment_signature=signature)
    assert replay.status_code == 200 and replay["Idempotent-Replayed"] == "true"
    assert replay.json()["display_status"] == "SETTLED_FULFILLMENT_UNKNOWN_NEEDS_REVIEW"
    assert len(upstream.calls) == 1 and ChainTransaction.objects.count() == 1
