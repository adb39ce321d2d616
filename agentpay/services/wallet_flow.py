"""The wallet rail, step by step (seed 004 §3.2): authorize → hold → dispatch → upstream →
capture / release / keep held.

`intent_drive_wallet` looks at the lines as they are and takes the next step, so the same code
starts a fresh intent and resumes one whose request crashed before the upstream was called.
Each step is one acceptance (one transaction); the upstream call runs between them, after
`dispatch` committed, never inside a transaction. Once dispatched, a call is never sent again:
an unknown outcome is resolved only by the status query (`agentpay.services.recovery`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from agentpay.bridge import ApiAccess, trusted_now
from agentpay.models import PaymentIntent, TenantStatus
from agentpay.services.acceptance import intent_accept
from agentpay.services.results import Cause, Outcome, Step
from agentpay.upstream import UpstreamAnswer, upstream_forward

# What each upstream answer means, as the steps accepted together (seed §3.2).
ANSWER_STEPS = {
    "2xx": ("upstream_2xx", [Step("settlement", "capture"), Step("intent", "settlement_confirmed")]),
    "4xx": ("upstream_4xx", [Step("settlement", "release"), Step("intent", "settlement_released")]),
    "5xx": ("upstream_5xx", []),  # hold kept: the upstream may have acted
    "timeout": ("upstream_timeout", []),
}


@dataclass(frozen=True)
class Driven:
    outcome: Outcome | None  # the last acceptance taken
    answer: UpstreamAnswer | None = None  # set when this request called the upstream
    refusal: str = ""  # why the intent stopped short: INSUFFICIENT_BALANCE, POLICY_DENIED, …
    detail: str = ""


def _accept(intent: PaymentIntent, cause: Cause, *steps: Step) -> Outcome:
    return intent_accept(intent_id=intent.intent_id, steps=list(steps), cause=cause, now=trusted_now())


def intent_drive_wallet(*, intent: PaymentIntent, cause: Cause, access: ApiAccess, request_id: uuid.UUID) -> Driven:
    last: Outcome | None = None
    while True:
        intent.refresh_from_db()
        settlement = intent.settlements.order_by("-pk").first()
        fulfillment = intent.fulfillment
        if intent.state == "created":
            if intent.tenant.status == TenantStatus.FROZEN or not access.allowed:
                why = "the tenant is frozen" if intent.tenant.status == TenantStatus.FROZEN else access.detail
                last = _accept(intent, cause, Step("intent", "policy_denied", {"reason": why}))
                return Driven(last, refusal="POLICY_DENIED", detail=why)
            last = _accept(intent, cause, Step("intent", "payload_verified", {"api_key": "verified"}))
        elif intent.state == "authorized" and settlement.state == "not_started":
            last = _accept(intent, cause, Step("settlement", "hold_acquired"))
            if not last.accepted and last.refusal_code == "INSUFFICIENT_BALANCE":
                # seed §1: too little balance is a 402, never a fallback to the chain.
                failed = _accept(intent, cause, Step("settlement", "hold_failed", {"why": last.detail}),
                                 Step("intent", "settlement_failed"))
                return Driven(failed, refusal="INSUFFICIENT_BALANCE", detail=last.detail)
        elif intent.state == "authorized" and settlement.state == "held" and fulfillment.state == "not_started":
            last = _accept(intent, cause, Step("fulfillment", "dispatch"))
            if last.accepted:
                return _forward_and_settle(intent, cause, fulfillment.fulfillment_id, request_id)
        else:
            return Driven(last)
        if last is not None and not last.accepted:
            return Driven(last, refusal=last.refusal_code, detail=last.detail)


def _forward_and_settle(intent: PaymentIntent, cause: Cause, fulfillment_id: str, request_id: uuid.UUID) -> Driven:
    answer = upstream_forward(route=intent.route, fulfillment_id=fulfillment_id, request_id=request_id,
                              path=intent.forward_path, query=intent.forward_query,
                              content_type=intent.forward_content_type, body=bytes(intent.forward_body))
    event, then = ANSWER_STEPS[answer.outcome]
    data = {"status": answer.status} if answer.status is not None else {}
    if answer.error:
        data["error"] = answer.error
    outcome = _accept(intent, cause, Step("fulfillment", event, data), *then)
    return Driven(outcome, answer=answer)
