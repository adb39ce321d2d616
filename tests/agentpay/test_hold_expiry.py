"""A hold whose call was never dispatched expires (wallet-ledger-spec §5.5, the spec's C14): the
agent's request died after the hold and it never retried. The job releases the hold through
the acceptance service and the intent expires; a dispatched call's hold never does."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
import time_machine

from agentpay.bridge import trusted_now
from agentpay.jobs import JOBS, agentpay_job_run
from agentpay.models import IntentReceipt, LedgerAccount, PaymentIntent, Transfer
from agentpay.schedule import JOB_CADENCE
from agentpay.services.acceptance import intent_accept
from agentpay.services.intents import intent_claim_lease, intent_open, request_digest
from agentpay.services.results import Cause, Step
from agentpay.services.wallet_flow import authorize_and_hold

pytestmark = pytest.mark.django_db

JOB = "agentpay_hold_expiry"
EXPIRE = [Step("settlement", "hold_expired"), Step("intent", "hold_expired")]


def crashed_after_hold(tenant, route, key: str = "k-1", body: bytes = b'{"q": 1}') -> PaymentIntent:
    """What a gateway request leaves when its process dies right after the hold committed: the
    intent opened authorized and held (the gateway takes the hold as it opens the intent), never
    dispatched, its lease still set."""
    now = trusted_now()
    digest = request_digest(method="POST", route_slug=route.slug, path="run", query="",
                            content_type="application/json", body=body)
    opened = intent_open(tenant=tenant, route=route, rail="wallet", idempotency_key=key, digest=digest,
                         forward_path="run", forward_query="", content_type="application/json", body=body,
                         request_id=uuid.uuid4(), now=now,
                         steps=authorize_and_hold(route.price_minor))
    assert opened.lines.intent == "authorized" and opened.lines.settlement == "held"
    assert opened.intent.processing_until is not None
    return opened.intent


def lines(intent: PaymentIntent) -> tuple[str, str, str]:
    intent.refresh_from_db()
    return intent.state, intent.settlements.get().state, intent.fulfillment.state


def available(tenant) -> int:
    return LedgerAccount.objects.get(kind="wallet", tenant=tenant).available


def later(seconds: float):
    return time_machine.travel(trusted_now() + timedelta(seconds=seconds), tick=False)


def test_the_job_is_scheduled():
    assert JOB in JOBS and JOB in JOB_CADENCE


def test_an_undispatched_hold_expires_after_the_ttl(funded, routes, upstream, call, settings):
    intent = crashed_after_hold(funded, routes["ok"])
    assert available(funded) == 850
    with later(settings.AGENTPAY_UNDISPATCHED_HOLD_TTL_SECONDS - 5):
        early = agentpay_job_run(JOB)
    assert (early.examined, early.changed) == (0, 0)
    assert lines(intent) == ("authorized", "held", "not_started")
    with later(settings.AGENTPAY_UNDISPATCHED_HOLD_TTL_SECONDS + 1):
        run = agentpay_job_run(JOB)
        again = agentpay_job_run(JOB)
        # The agent comes back after all: it is told the intent expired; nothing is sent upstream.
        response = call("ok")
    assert (run.examined, run.changed, run.refused) == (1, 1, 0), run.notes
    assert again.examined == 0  # expired once
    assert lines(intent) == ("expired", "released", "not_started")
    assert available(funded) == 1000
    hold = intent.settlements.get().hold
    release = Transfer.objects.get(pending=hold)
    assert release.kind == "void_pending" and release.actor == f"job:{JOB}"
    assert list(IntentReceipt.objects.filter(intent=intent, accepted=True, cause_kind="job")
                .values_list("line", "event", "to_state")) == [("settlement", "hold_expired", "released"),
                                                               ("intent", "hold_expired", "expired")]
    assert response.status_code == 200
    assert response["AgentPay-Display-Status"] == "EXPIRED"
    assert upstream.calls == []


def test_a_live_request_keeps_its_hold(funded, routes, settings):
    intent = crashed_after_hold(funded, routes["ok"])
    with later(settings.AGENTPAY_UNDISPATCHED_HOLD_TTL_SECONDS + 1):
        assert intent_claim_lease(intent=intent, now=trusted_now())  # the agent retries just now
        assert agentpay_job_run(JOB).examined == 0
        outcome = intent_accept(intent_id=intent.intent_id, steps=EXPIRE, cause=Cause.job(JOB))
    assert not outcome.accepted and outcome.refusal_code == "REQUEST_IN_FLIGHT"
    assert lines(intent) == ("authorized", "held", "not_started")
    assert available(funded) == 850


@pytest.mark.parametrize("route", ["boom", "hang"])
def test_a_dispatched_hold_never_expires(funded, routes, call, route):
    """5xx or timeout: the upstream may have acted, so the hold stays held, past every TTL."""
    response = call(route)
    assert response.status_code in (502, 504)
    intent = PaymentIntent.objects.get(intent_id=response.json()["intent_id"])
    assert lines(intent) == ("authorized", "held", "unknown")
    with later(3 * 3600):
        run = agentpay_job_run(JOB)
        outcome = intent_accept(intent_id=intent.intent_id, steps=EXPIRE, cause=Cause.job(JOB))
    assert run.examined == 0
    assert not outcome.accepted and outcome.refusal_code == "FULFILLMENT_DISPATCHED"
    assert lines(intent) == ("authorized", "held", "unknown")
    assert available(funded) == 850


def test_a_dispatch_that_commits_first_wins(funded, routes, settings):
    intent = crashed_after_hold(funded, routes["ok"])
    with later(settings.AGENTPAY_UNDISPATCHED_HOLD_TTL_SECONDS + 60):
        cause = Cause.request(uuid.uuid4(), funded.tenant_id)
        assert intent_accept(intent_id=intent.intent_id, steps=[Step("fulfillment", "dispatch")], cause=cause).accepted
        run = agentpay_job_run(JOB)
        outcome = intent_accept(intent_id=intent.intent_id, steps=EXPIRE, cause=Cause.job(JOB))
    assert run.examined == 0
    assert not outcome.accepted and outcome.refusal_code == "FULFILLMENT_DISPATCHED"
    assert lines(intent) == ("authorized", "held", "in_progress")


def test_an_expiry_asked_ahead_of_the_clock_is_refused(funded, routes, settings):
    intent = crashed_after_hold(funded, routes["ok"])
    ahead = trusted_now() + timedelta(seconds=settings.AGENTPAY_UNDISPATCHED_HOLD_TTL_SECONDS + 1)
    assert agentpay_job_run(JOB, now=ahead).refused == 1
    outcome = intent_accept(intent_id=intent.intent_id, steps=EXPIRE, cause=Cause.job(JOB), now=ahead)
    assert not outcome.accepted and outcome.refusal_code == "NOW_AFTER_TRUSTED_CLOCK"
    assert lines(intent) == ("authorized", "held", "not_started")


def crashed_before_hold(tenant, route, key: str = "k-2") -> PaymentIntent:
    """A request that died between its two acceptances: authorized, nothing held."""
    now = trusted_now()
    body = b'{"q": 2}'
    digest = request_digest(method="POST", route_slug=route.slug, path="run", query="",
                            content_type="application/json", body=body)
    intent = intent_open(tenant=tenant, route=route, rail="wallet", idempotency_key=key, digest=digest,
                         forward_path="run", forward_query="", content_type="application/json", body=body,
                         request_id=uuid.uuid4(), now=now).intent
    assert intent_accept(intent_id=intent.intent_id, steps=[Step("intent", "payload_verified")],
                         cause=Cause.request(uuid.uuid4(), tenant.tenant_id), now=now).accepted
    return intent


def test_an_authorization_never_held_expires_after_the_ttl(funded, routes, call, settings):
    intent = crashed_before_hold(funded, routes["ok"])
    ttl = settings.AGENTPAY_UNDISPATCHED_HOLD_TTL_SECONDS
    with later(ttl - 5):
        assert agentpay_job_run(JOB).changed == 0
        assert intent_claim_lease(intent=intent, now=trusted_now())  # the agent retries just now…
    with later(ttl + 1):
        leased = agentpay_job_run(JOB)  # …and its lease (still live) keeps the intent open
    assert (leased.changed, lines(intent)) == (0, ("authorized", "not_started", "not_started"))
    with later(ttl + 3600):
        run = agentpay_job_run(JOB)
        assert agentpay_job_run(JOB).examined == 0  # terminal now: not picked again
    assert (run.examined, run.changed) == (1, 1)
    assert lines(intent) == ("expired", "not_started", "not_started")
    assert available(funded) == 1000 and not Transfer.objects.filter(kind="pending").exists()
    receipt = IntentReceipt.objects.filter(intent=intent, accepted=True).order_by("pk").last()
    assert (receipt.event, receipt.to_state, receipt.actor) == ("hold_expired", "expired", f"job:{JOB}")
