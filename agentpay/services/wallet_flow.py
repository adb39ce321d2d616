"""The wallet rail, step by step (seed 004 §3.2): authorize → hold → dispatch → upstream →
capture / release / keep held.

`intent_drive_wallet` looks at the lines as they are and takes the next step, so the same code
starts a fresh intent and resumes one whose request crashed before the upstream was called.
A fresh gateway call takes authorize, hold and dispatch as its intent is opened (`open_steps`:
one transaction, the steps accepted together or not at all, each checked against the tables
after the one before it), then the upstream's answer with its capture or release. A resumed
intent takes authorize + hold as one acceptance, dispatch as a second. Either way the upstream
call runs after `dispatch` committed, never inside a transaction. Once dispatched, a call is never sent again:
an unknown outcome is resolved only by the status query (`agentpay.services.recovery`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

from django.contrib.postgres.aggregates import ArrayAgg
from django.db.models import Q, Value

from agentpay.bridge import ApiAccess, trusted_now
from agentpay.models import AccountKind, Fulfillment, PaymentIntent, Settlement, Tenant, TenantStatus
from agentpay.services.acceptance import Known, intent_accept
from agentpay.services.results import Cause, Outcome, RequestAnswer, Step
from agentpay.states import FULFILLMENT, INITIAL, INTENT, SETTLEMENT, Lines
from agentpay.upstream import UpstreamAnswer, upstream_forward

# What each upstream answer means, as the steps accepted together (seed §3.2).
ANSWER_STEPS = {
    "2xx": ("upstream_2xx", [Step("settlement", "capture"), Step("intent", "settlement_confirmed")]),
    "4xx": ("upstream_4xx", [Step("settlement", "release"), Step("intent", "settlement_released")]),
    "5xx": ("upstream_5xx", []),  # hold kept: the upstream may have acted
    "timeout": ("upstream_timeout", []),
}


# The gateway's answer to an upstream answer, for the request's row (forward_and_accept).
Answered = Callable[[UpstreamAnswer], RequestAnswer | None]

# Why a hold is refused (the effect's code) → the hold_failed reason.
HOLD_REFUSALS = {"INSUFFICIENT_BALANCE": "insufficient_balance", "WALLET_FROZEN": "account_frozen"}
# A policy_denied reason → how the gateway answers it.
POLICY_REFUSALS = {"currency_mismatch": "CURRENCY_MISMATCH", "no_wallet": "NO_WALLET"}


def _policy_refusal(intent: PaymentIntent, access: ApiAccess) -> tuple[str, str]:
    """(reason, detail) of a policy refusal at authorization; ('', '') when the call may go on."""
    # One read: the tenant's status and its wallets' currencies.
    wallets = ArrayAgg("accounts__currency", filter=Q(accounts__kind=AccountKind.WALLET), default=Value([]))
    status, currencies = (Tenant.objects.filter(pk=intent.tenant_id).annotate(currencies=wallets)
                          .values_list("status", "currencies").get())
    if status == TenantStatus.FROZEN:
        return "tenant_frozen", "the tenant is frozen"
    if not access.allowed:
        return "entitlement_denies_api_tokens", access.detail
    if not currencies:
        return "no_wallet", "the tenant has no wallet; one is made when the tenant is set up (tenant_create)"
    if intent.currency not in currencies:
        return "currency_mismatch", (f"the route is priced in {intent.currency}; the tenant's wallet is in "
                                     f"{', '.join(sorted(currencies))}")
    return "", ""


@dataclass(frozen=True)
class Driven:
    outcome: Outcome | None  # the last acceptance taken
    answer: UpstreamAnswer | None = None  # set when this request called the upstream
    refusal: str = ""  # why the intent stopped short: INSUFFICIENT_BALANCE, POLICY_DENIED, …
    detail: str = ""
    lease_released: bool = False  # the answer's acceptance cleared the request's processing lease
    answer_logged: RequestAnswer | None = None  # the request's row took this answer with the acceptance


def _accept(intent: PaymentIntent, cause: Cause, *steps: Step) -> Outcome:
    return intent_accept(intent_id=intent.intent_id, steps=list(steps), cause=cause, now=trusted_now())


def intent_drive_wallet(*, intent: PaymentIntent, cause: Cause, access: ApiAccess, request_id: uuid.UUID,
                        just_opened: bool = False, opened_lines: Lines | None = None,
                        opened_settlement: Settlement | None = None, release_lease: bool = False,
                        answered: Answered | None = None) -> Driven:
    """`just_opened`: `intent` is the one `intent_open` inserted in this request (its fulfillment
    is cached on it, its lines are `opened_lines`, the initial ones when not given: authorized and
    held when it took authorize_and_hold on open, and dispatched too when it took open_steps: then
    the upstream is called at once), so nothing is read back. `opened_settlement`: its settlement
    as the open wrote it (with the hold): the upstream's answer is then decided on the rows as
    written, without the lock read (acceptance.Known).
    `release_lease`: the upstream's answer is accepted with the request's processing lease cleared
    (one UPDATE fewer); `Driven.lease_released` says whether that happened. `answered`: see
    forward_and_accept."""
    last: Outcome | None = None
    # The lines as they are (a resumed intent may be anywhere).
    if just_opened:
        fulfillment = intent.fulfillment
        lines = opened_lines or Lines(rail=intent.rail, intent=INITIAL[INTENT], settlement=INITIAL[SETTLEMENT],
                                      fulfillment=INITIAL[FULFILLMENT])
    else:
        intent.refresh_from_db(fields=["state", "generation", "processing_until"])
        settlement = intent.settlements.order_by("-pk").first()
        fulfillment = Fulfillment.objects.only("fulfillment_id", "state").get(intent=intent)
        lines = Lines(rail=intent.rail, intent=intent.state, settlement=settlement.state,
                      fulfillment=fulfillment.state)
    if lines.intent == "created":
        reason, why = _policy_refusal(intent, access)
        if reason:
            last = _accept(intent, cause, Step("intent", "policy_denied", {"reason": reason, "detail": why}))
            return Driven(last, refusal=POLICY_REFUSALS.get(reason, "POLICY_DENIED"), detail=why)
    steps = _steps_to_hold(lines, intent)
    if steps:
        last = _accept(intent, cause, *steps)
        if not last.accepted and last.refusal_code in HOLD_REFUSALS:
            # seed §1: too little balance is a 402, never a fallback to the chain.
            reason = HOLD_REFUSALS[last.refusal_code]
            authorize = [step for step in steps if step.line == INTENT]
            failed = _accept(intent, cause, *authorize,
                             Step("settlement", "hold_failed", {"reason": reason, "detail": last.detail}),
                             Step("intent", "settlement_failed"))
            return Driven(failed, refusal=last.refusal_code, detail=last.detail)
        if not last.accepted:
            return Driven(last, refusal=last.refusal_code, detail=last.detail)
        lines = last.lines
    if just_opened and (lines.intent, lines.settlement, lines.fulfillment) == DISPATCHED_ON_OPEN:
        # This request's open took the hold and the dispatch and committed them (open_steps): the
        # upstream is this request's to call, once. A resumed intent in these lines is never sent
        # again (recovery's status query resolves it).
        known = Known(intent, opened_settlement, fulfillment) if opened_settlement is not None else None
        return forward_and_accept(intent, cause, fulfillment.fulfillment_id, request_id, ANSWER_STEPS,
                                  release_lease=release_lease, known=known, answered=answered)
    if not (lines.intent == "authorized" and lines.settlement == "held" and lines.fulfillment == "not_started"):
        return Driven(last)
    # Its own acceptance, committed before the upstream is called: a request that dies between the
    # hold and here leaves a hold never dispatched, which expires (wallet-ledger-spec §5.5).
    last = _accept(intent, cause, Step("fulfillment", "dispatch"))
    if not last.accepted:
        return Driven(last, refusal=last.refusal_code, detail=last.detail)
    return forward_and_accept(intent, cause, fulfillment.fulfillment_id, request_id, ANSWER_STEPS,
                              release_lease=release_lease, answered=answered)


def authorize_and_hold(amount: int) -> list[Step]:
    """A fresh wallet intent's authorize → hold: the gateway asks them as the intent is opened."""
    return [Step("intent", "payload_verified", {"api_key": "verified"}),
            Step("settlement", "hold_acquired", {"amount": amount})]


# The lines an open with `open_steps` leaves: held, and dispatched to the upstream.
DISPATCHED_ON_OPEN = ("authorized", "held", "in_progress")


def open_steps(amount: int) -> list[Step]:
    """A fresh wallet intent's authorize → hold → dispatch, accepted as it is opened (one
    transaction, generation 1: the seed needs only open + hold | upstream | answer). The dispatch
    still commits before the upstream is called. A request that dies after that commit leaves a
    dispatched call the upstream may never have seen, which recovery's status query resolves
    (wallet-ledger-spec §9.2), as when it died between a separate dispatch's commit and the call;
    the window a never-dispatched hold had (expired by its TTL, §5.5) is gone for a fresh call."""
    return [*authorize_and_hold(amount), Step("fulfillment", "dispatch")]


def _steps_to_hold(lines: Lines, intent: PaymentIntent) -> list[Step]:
    """What is left of authorize → hold, asked as one acceptance (all or none): [] when the
    intent is past its hold or is not the wallet flow's to drive."""
    if lines.intent not in ("created", "authorized") or lines.settlement != "not_started":
        return []
    steps = authorize_and_hold(intent.amount)
    return steps if lines.intent == "created" else steps[1:]


def forward_and_accept(intent: PaymentIntent, cause: Cause, fulfillment_id: str, request_id: uuid.UUID,
                       answer_steps: dict[str, tuple[str, list[Step]]], *, release_lease: bool = False,
                       known: Known | None = None, answered: Answered | None = None) -> Driven:
    """The one call to the upstream, after `dispatch` committed (outside any transaction), and
    the acceptance of what it answered: the fulfillment's event and the rail's `answer_steps`
    (with the processing lease cleared when `release_lease`; on the `known` rows when given).
    `answered`: what the gateway will answer for the upstream's answer when it is accepted (None:
    nothing to write yet); the request's row takes it in the acceptance's statement."""
    answer = upstream_forward(route=intent.route, fulfillment_id=fulfillment_id, request_id=request_id,
                              path=intent.forward_path, query=intent.forward_query,
                              content_type=intent.forward_content_type, body=bytes(intent.forward_body))
    event, then = answer_steps[answer.outcome]
    data = {"status": answer.status} if answer.status is not None else {}
    if answer.error:
        data["error"] = answer.error
    request_answer = answered(answer) if answered is not None else None
    outcome = intent_accept(intent_id=intent.intent_id, steps=[Step("fulfillment", event, data), *then], cause=cause,
                            now=trusted_now(), release_lease=release_lease, known=known, request_answer=request_answer)
    return Driven(outcome, answer=answer, lease_released=release_lease and outcome.accepted,
                  answer_logged=request_answer if outcome.request_answered else None)
