"""With a 1-second block time a paid call settles and completes in one request (the latency
figure itself is the bench's: `python -m bench --only agentpay_chain`), and settlements signed
at once by parallel workers take distinct sender nonces and all land."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from agentpay.chain.settlement import settlement_submit
from agentpay.models import ChainTransaction
from agentpay.services.onchain_flow import intent_drive_onchain
from agentpay.services.results import Cause
from tests.agentpay_chain.support import authorized_intent, lines, world

pytestmark = pytest.mark.django_db(transaction=True)
CAUSE = Cause.system("test")


def test_with_one_second_blocks_a_paid_call_completes_in_its_request(chain, upstream, settings):
    settings.AGENTPAY_ONCHAIN_POLL_SECONDS = 0.1
    w = world(chain, upstream)
    intents = [authorized_intent(w, chain.payers[0]) for _ in range(3)]
    chain.set_block_time(1)
    try:
        took = []
        for intent in intents:
            started = time.monotonic()
            driven = intent_drive_onchain(intent=intent, cause=CAUSE, access=None,
                                          request_id=intent.first_request_id, wait_seconds=5)
            took.append(time.monotonic() - started)
            assert driven.answer is not None and driven.answer.status == 200
            assert lines(intent) == ("completed", "confirmed", "succeeded")
    finally:
        chain.set_block_time(None)
    print(f"\nsubmit → completed with 1 s blocks: {', '.join(f'{t:.2f} s' for t in took)}")


def test_parallel_signers_never_share_a_sender_nonce(chain, upstream):
    w = world(chain, upstream)
    payer = chain.payers[0]
    before = chain.balance(payer.address)
    intents = [authorized_intent(w, payer) for _ in range(6)]
    errors: list[BaseException] = []

    def submit(intent_id: str) -> None:
        try:
            settlement_submit(intent_id, cause=CAUSE)
        except BaseException as exc:  # reported below, not swallowed
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=submit, args=(i.intent_id,)) for i in intents]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    nonces = list(ChainTransaction.objects.values_list("sender_nonce", flat=True))
    assert len(nonces) == 6 and len(set(nonces)) == 6
    for intent in intents:
        intent_drive_onchain(intent=intent, cause=CAUSE, access=None, request_id=intent.first_request_id,
                             wait_seconds=3)
        assert lines(intent) == ("completed", "confirmed", "succeeded")
    assert chain.balance(payer.address) == before - 6 * w.amount
