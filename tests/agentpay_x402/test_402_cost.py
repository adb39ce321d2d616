"""What one unpaid call costs the database (issue 18: 402 issuance at 200/s): outside any
transaction of the caller, the front read and the open's one statement, committed on its own in
autocommit (no BEGIN, no COMMIT); a key already taken still finds its intent and answers the
same challenge; the first 402's header, kept from the challenge's building, is the stored one's."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agentpay.models import GatewayRequest, PaymentChallenge, PaymentIntent
from agentpay.x402.headers import decode_payment_required, encode_payment_required_document

pytestmark = pytest.mark.django_db(transaction=True)  # no test transaction: the open commits as it would in a worker


def _kinds(captured: CaptureQueriesContext) -> list[str]:
    return [q["sql"].split(" ")[0].rstrip(";") for q in captured.captured_queries]


def test_an_unpaid_call_is_two_statements_and_no_transaction_block(call, chain_routes, network):
    assert not connection.in_atomic_block
    call("paid", "k-0")  # the key's first use stamps last_used_at (at most once a minute)
    with CaptureQueriesContext(connection) as captured:
        answer = call("paid", "k-1")
    assert answer.status_code == 402 and "PAYMENT-REQUIRED" in answer
    assert _kinds(captured) == ["SELECT", "WITH"]  # the front read, the open (intent, challenge, row...)
    intent = PaymentIntent.objects.get(idempotency_key="k-1")
    assert intent.state == "challenged" and PaymentChallenge.objects.filter(intent=intent).count() == 1
    assert GatewayRequest.objects.get(intent=intent).answer_status == 402


def test_a_taken_key_in_autocommit_finds_its_intent(call, chain_routes, network):
    first = call("paid", "k-2")
    with CaptureQueriesContext(connection) as captured:
        again = call("paid", "k-2")  # the open's INSERT meets the unique key, alone: nothing to roll back
    assert again.status_code == 402 and again["PAYMENT-REQUIRED"] == first["PAYMENT-REQUIRED"]
    assert "BEGIN" not in _kinds(captured)[:3]
    assert PaymentIntent.objects.count() == 1 and PaymentChallenge.objects.count() == 1
    assert GatewayRequest.objects.filter(intent__isnull=False).count() == 2


@pytest.mark.parametrize("subpath", ["run", "r\u00e9sum\u00e9/\u2028\"q\"?a=1&b=<x>", "emoji/\U0001f600"])
def test_the_first_402_sends_the_stored_challenge_s_bytes(client, api_key, chain_routes, network, subpath):
    """The issuing request's PAYMENT-REQUIRED is kept from the challenge's building; it is the
    header a replay encodes from the stored document, byte for byte, and names this resource."""
    answer = client.post(f"/agentpay/v1/routes/paid/{subpath}", data=b"{}", content_type="application/json",
                         HTTP_IDEMPOTENCY_KEY=f"k-{len(subpath)}", HTTP_AUTHORIZATION=f"Bearer {api_key}")
    assert answer.status_code == 402
    challenge = PaymentChallenge.objects.get()
    assert answer["PAYMENT-REQUIRED"] == encode_payment_required_document(challenge.requirement)
    required = decode_payment_required(answer["PAYMENT-REQUIRED"])
    assert required.resource.url == challenge.requirement["resource"]["url"]
    assert required.resource.url.startswith("http://testserver/agentpay/v1/routes/paid/")
    assert required.accepts[0].amount == str(int(challenge.amount))
