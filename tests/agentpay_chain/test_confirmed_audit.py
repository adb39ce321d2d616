"""The confirmed audit on the real local chain (agentpay.chain.audit).

A reorganisation deeper than the confirmation depth takes a confirmed, delivered settlement off
the chain. The line never changes (terminal); the audit job reads the chain again, sends the same
signed bytes when they can still land, and leaves a finding a billing lead can read — or one
that needs review when the money can no longer move.
"""

from __future__ import annotations

import pytest

from agentpay.bridge import trusted_now
from agentpay.jobs import agentpay_job_run
from agentpay.models import ChainTransaction, SettlementAuditFinding
from agentpay.services.onchain_flow import intent_drive_onchain
from agentpay.services.results import Cause
from tests.agentpay_chain.support import authorized_intent, lines, world

pytestmark = pytest.mark.django_db(transaction=True)
CAUSE = Cause.system("test")


def delivered(w, payer, **auth):
    intent = authorized_intent(w, payer, **auth)
    answer = intent_drive_onchain(intent=intent, cause=CAUSE, access=None, request_id=intent.first_request_id,
                                  wait_seconds=5.0).answer
    assert answer is not None and answer.status == 200
    return intent


def audit():
    return agentpay_job_run("agentpay_confirmed_audit")


def findings(intent) -> list[tuple[str, str, bool]]:
    return [(f.evidence_kind, f.action, f.needs_review)
            for f in SettlementAuditFinding.objects.filter(transaction__settlement__intent=intent).order_by("id")]


@pytest.fixture
def audit_every_run(settings):
    settings.AGENTPAY_CONFIRMED_AUDIT_EVERY_SECONDS = 0


def test_a_confirmed_settlement_still_on_chain_leaves_no_finding_and_is_read_again_only_when_due(
        chain, upstream, settings):
    w = world(chain, upstream)
    intent = delivered(w, chain.payers[0])
    assert audit().examined == 0  # the confirming query was the last read; the next is due in 600 s
    settings.AGENTPAY_CONFIRMED_AUDIT_EVERY_SECONDS = 0
    due = audit()
    assert (due.examined, due.changed, due.errors) == (1, 0, 0), due.notes
    assert findings(intent) == []
    assert ChainTransaction.objects.get(settlement__intent=intent).last_query_answer.startswith("confirmed")
    settings.AGENTPAY_CONFIRMED_AUDIT_EVERY_SECONDS = 600
    assert audit().examined == 0


def test_a_deep_reorg_after_delivery_sends_the_same_bytes_again_and_clears(chain, upstream, audit_every_run):
    chain.mine(3)  # the reorg stays above the fixture's snapshot, which it would otherwise cut away
    w = world(chain, upstream)
    payer = chain.payers[0]
    before = chain.balance(payer.address)
    intent = delivered(w, payer)
    tx = ChainTransaction.objects.get(settlement__intent=intent)
    chain.reorg(2)
    assert chain.balance(payer.address) == before  # the chain forgot the payment we delivered on

    run = audit()
    assert run.errors == 0, run.notes
    assert findings(intent) == [("dropped", "rebroadcast", False)]
    chain.mine()
    assert chain.balance(payer.address) == before - w.amount  # paid once, by the same bytes

    audit()
    assert findings(intent) == [("dropped", "rebroadcast", False), ("confirmed", "cleared", False)]
    audit()
    assert len(findings(intent)) == 2  # nothing new to say
    assert lines(intent) == ("completed", "confirmed", "succeeded")  # terminal: never changes
    assert len(upstream.calls) == 1
    assert ChainTransaction.objects.count() == 1
    assert ChainTransaction.objects.get(pk=tx.pk).tx_hash == tx.tx_hash


def test_a_deep_reorg_past_valid_before_needs_review_and_sends_nothing(chain, upstream, audit_every_run):
    chain.mine(3)
    w = world(chain, upstream)
    payer = chain.payers[0]
    before = chain.balance(payer.address)
    now_on_chain = max(chain.latest_timestamp(), int(trusted_now().timestamp()))
    valid_before = now_on_chain + 120
    intent = delivered(w, payer, valid_before=valid_before)
    attempts = ChainTransaction.objects.get(settlement__intent=intent).broadcast_attempts
    chain.reorg(2)
    chain.set_next_block_timestamp(valid_before + 60)
    chain.mine()  # chain time is past validBefore: the signed authorization can never pay now

    audit()
    assert findings(intent) == [("failed", "none", True)]
    audit()
    assert findings(intent) == [("failed", "none", True)]  # one open finding says it once
    assert ChainTransaction.objects.get(settlement__intent=intent).broadcast_attempts == attempts
    assert chain.balance(payer.address) == before
    assert lines(intent) == ("completed", "confirmed", "succeeded")


def test_settlements_confirmed_before_the_window_are_not_read_again(chain, upstream, settings, audit_every_run):
    w = world(chain, upstream)
    delivered(w, chain.payers[0])
    settings.AGENTPAY_CONFIRMED_AUDIT_WINDOW_SECONDS = 0
    assert audit().examined == 0
    settings.AGENTPAY_CONFIRMED_AUDIT_WINDOW_SECONDS = 3600
    assert audit().examined == 1
