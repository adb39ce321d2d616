"""The on-chain rail, step by step (seed 004 §3.1, "plan A": settle first, then fulfil):
authorized → submit (sign, persist, commit, broadcast) → query until confirmed → dispatch →
upstream → completed / refund required / unknown.

`intent_drive_onchain` looks at the lines as they are and takes the next step, so the same call
starts a fresh authorized intent, resumes a replayed one (which then only queries: its
transaction is persisted, never signed again) and finishes one whose settlement a job
confirmed meanwhile. No dispatch ever happens before the settlement is confirmed (the tables
refuse it too), and none for an intent that went to needs_review (C09).

What the gateway renders from the returned `Driven` (the wallet's dataclass):
- `answer` set: this request called the upstream (2xx → completed; 4xx → refund required, the
  intent stays authorized with its RefundObligation in the review queue (C08) and goes to
  needs_review at the recovery deadline; 5xx/timeout → fulfillment unknown, the existing
  recovery);
- `refusal` "SETTLEMENT_FAILED" / "AUTHORIZATION_EXPIRED": the payment failed, nothing was
  delivered or charged;
- otherwise, with the settlement still submitted/pending/unknown when the wait ended, `refusal`
  is "" and `detail` says so: answer 202 with the view, never 402 (the payer's authorization is
  ours; a new one could pay twice).
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime

from django.conf import settings

from agentpay.bridge import ApiAccess, trusted_now
from agentpay.chain.settlement import (
    LIVE,
    settlement_authorization_expire,
    settlement_query,
    settlement_submit,
)
from agentpay.models import ChainAuthorization, ChainTransaction, Fulfillment, PaymentIntent
from agentpay.services.acceptance import intent_accept
from agentpay.services.results import Cause, Outcome, Step
from agentpay.services.wallet_flow import Driven, forward_and_accept
from agentpay.states import Lines

# What each upstream answer means after a confirmed on-chain payment (seed §3.1).
ANSWER_STEPS = {
    "2xx": ("upstream_2xx", [Step("intent", "settlement_confirmed")]),
    "4xx": ("upstream_4xx", []),  # the effect records the refund obligation (C08)
    "5xx": ("upstream_5xx", []),
    "timeout": ("upstream_timeout", []),
}


def _lines(intent: PaymentIntent) -> Lines:
    intent.refresh_from_db(fields=["state", "generation", "processing_until"])
    settlement = intent.settlements.order_by("-pk").first()
    fulfillment = Fulfillment.objects.only("state").get(intent=intent)
    return Lines(rail=intent.rail, intent=intent.state, settlement=settlement.state, fulfillment=fulfillment.state)


def _authorization_lapsed(intent: PaymentIntent, now: datetime) -> bool:
    """Past validBefore by the trusted clock and never signed: submitting could only revert."""
    authorization = ChainAuthorization.objects.filter(intent=intent).only("valid_before").first()
    if authorization is None or now < datetime.fromtimestamp(int(authorization.valid_before), tz=UTC):
        return False
    return not ChainTransaction.objects.filter(settlement__intent=intent).exists()


def intent_drive_onchain(*, intent: PaymentIntent, cause: Cause, access: ApiAccess, request_id: uuid.UUID,
                         wait_seconds: float | None = None) -> Driven:
    """Take the on-chain steps this request can take; wait up to `wait_seconds` (setting
    AGENTPAY_ONCHAIN_WAIT_SECONDS) for the settlement to be decided. `access` was checked when
    the intent was authorized; it is kept for the gateway's common call shape."""
    del access
    wait = settings.AGENTPAY_ONCHAIN_WAIT_SECONDS if wait_seconds is None else wait_seconds
    give_up = time.monotonic() + wait
    last: Outcome | None = None
    lines = _lines(intent)
    queried = False
    while True:
        if last is not None:
            lines = last.lines
        if lines.intent == "authorized" and lines.settlement == "not_started":
            now = trusted_now()
            if _authorization_lapsed(intent, now):
                last = settlement_authorization_expire(intent.intent_id, cause=cause, now=now)
                return Driven(last, refusal="AUTHORIZATION_EXPIRED", detail="the signed authorization expired "
                                                                            "before it was submitted")
            last = settlement_submit(intent.intent_id, cause=cause, now=now)
            if not last.accepted and last.lines.settlement == "not_started":
                return Driven(last, refusal=last.refusal_code, detail=last.detail)
        elif lines.settlement in LIVE:
            if queried and time.monotonic() >= give_up:
                return Driven(last, detail=f"the settlement is still {lines.settlement}; replay the same "
                                           f"Idempotency-Key to resume")
            if queried:
                time.sleep(settings.AGENTPAY_ONCHAIN_POLL_SECONDS)
            last, queried = settlement_query(intent.intent_id, cause=cause, now=trusted_now()), True
        elif lines.settlement == "failed":
            return Driven(last, refusal="SETTLEMENT_FAILED", detail=last.detail if last else "the settlement failed")
        elif lines.intent == "expired" and lines.settlement == "not_started":
            return Driven(last, refusal="AUTHORIZATION_EXPIRED", detail="the signed authorization expired")
        elif lines.intent == "authorized" and lines.settlement == "confirmed" and lines.fulfillment == "not_started":
            last = intent_accept(intent_id=intent.intent_id, steps=[Step("fulfillment", "dispatch")], cause=cause,
                                 now=trusted_now())
            if not last.accepted:
                return Driven(last, refusal=last.refusal_code, detail=last.detail)
            return _forward(intent, cause, request_id)
        else:
            return Driven(last)


def _forward(intent: PaymentIntent, cause: Cause, request_id: uuid.UUID) -> Driven:
    fulfillment_id = Fulfillment.objects.only("fulfillment_id").get(intent=intent).fulfillment_id
    return forward_and_accept(intent, cause, fulfillment_id, request_id, ANSWER_STEPS)
