"""The gateway's on-chain rail (x402 v2; issue 18): the answers, from the intent's lines.

No PAYMENT-SIGNATURE: 402 + PAYMENT-REQUIRED (the stored challenge, the same bytes on every
replay while it is open). A PAYMENT-SIGNATURE: verified (agentpay.services.onchain_authorize),
then the settlement is driven (agentpay.services.onchain_flow) and the answer says where it got:

- upstream 2xx → its answer + PAYMENT-RESPONSE (success, the transaction);
- upstream 4xx → its answer + `AgentPay-Refund: required` (paid, not delivered; a refund is owed);
- upstream 5xx / timeout → 502 / 504 fulfillment-unknown;
- settlement submitted / pending / unknown when the wait ends → 202, the composite view,
  PAYMENT-RESPONSE (success false, errorReason settlement_pending, the transaction hash if one
  was signed) and advice to replay the same Idempotency-Key. Never a 402 once an authorization
  is accepted: a 402 is how a client signs again and pays twice;
- settlement failed → 402 settlement-failed with PAYMENT-RESPONSE errorReason;
- a bad payment → 402 payment-invalid with its reason (the intent is rejected; no new
  PAYMENT-REQUIRED: a new payment needs a new key); an unreadable header → 400, the intent
  unchanged and the open challenge sent again.

A replay of an authorized key resumes (the driver only queries what was signed); a different
PAYMENT-SIGNATURE on it is refused (422), never verified.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse, JsonResponse
from rest_framework.request import Request

from agentpay.api.problems import problem
from agentpay.api.request_log import PAYMENT_REQUIRED_ANSWER
from agentpay.bridge import ApiAccess, trusted_now
from agentpay.composite import display_status
from agentpay.models import ChainAuthorization, ChainTransaction, PaymentChallenge, PaymentIntent
from agentpay.selectors import intent_composite_view
from agentpay.services import onchain_authorize as authorize
from agentpay.services.intents import intent_claim_lease, intent_release_lease
from agentpay.services.onchain_flow import intent_drive_onchain
from agentpay.services.results import Cause
from agentpay.services.wallet_flow import Driven
from agentpay.states import FULFILLMENT, INITIAL, ONCHAIN, SETTLEMENT, Lines
from agentpay.x402.headers import (
    PAYMENT_REQUIRED,
    PAYMENT_RESPONSE,
    PAYMENT_SIGNATURE,
    encode_payment_required_document,
    encode_payment_response,
)

IN_FLIGHT = frozenset({"not_started", "submitted", "pending", "unknown"})
EXPOSED = f"{PAYMENT_REQUIRED}, {PAYMENT_RESPONSE}, AgentPay-Intent, AgentPay-Display-Status, Location"


def onchain_call(request: Request, *, intent: PaymentIntent, created: bool, cause: Cause,
                 access: ApiAccess) -> HttpResponse:
    """Answer one call on the on-chain rail for `intent` (opened or found under the key)."""
    signature = request.headers.get(PAYMENT_SIGNATURE)
    if created and signature is None and intent.state == "challenged":
        # Opened challenged in intent_open's one transaction, with no lease: the 402 from the rows it
        # wrote (the challenge is cached on the intent), nothing read back, nothing to release.
        lines = Lines(rail=ONCHAIN, intent="challenged", settlement=INITIAL[SETTLEMENT],
                      fulfillment=INITIAL[FULFILLMENT])
        return _payment_required(intent.intent_id, intent.challenge, display_status(lines))
    resource = request.build_absolute_uri()
    if not created:
        if intent.state not in ("created", "challenged") and signature is not None \
                and not authorize.onchain_same_payment(intent, signature) \
                and ChainAuthorization.objects.filter(intent=intent).exists():
            return _another_payment(intent)
        if intent.state not in ("created", "challenged", "authorized"):
            return _render(intent, None)
        if not intent_claim_lease(intent=intent, now=trusted_now()):
            return problem(409, "idempotency-in-flight", "A request with this Idempotency-Key is in flight",
                           "retry after it has finished; the replay will show its outcome",
                           intent_id=intent.intent_id, headers={"Retry-After": "1"})
    try:
        return _serve(request, intent, signature, resource, cause, access, just_opened=created)
    finally:
        intent_release_lease(intent=intent)


def _serve(request: Request, intent: PaymentIntent, signature: str | None, resource: str, cause: Cause,
           access: ApiAccess, *, just_opened: bool) -> HttpResponse:
    if not just_opened:  # one this request inserted is as it was written: created, generation 0
        intent.refresh_from_db(fields=["state", "generation"])
    if intent.state in ("created", "challenged"):
        if signature is None:
            return _challenge(intent, cause, access, resource)
        presented = authorize.onchain_present(intent=intent, header=signature, cause=cause, access=access,
                                              resource=resource)
        if presented.status != authorize.AUTHORIZED:
            return _not_authorized(intent, presented)
    elif signature is not None and not authorize.onchain_same_payment(intent, signature):
        return _another_payment(intent)
    driven = intent_drive_onchain(intent=intent, cause=cause, access=access,
                                  request_id=cause.request_id)
    return _render(PaymentIntent.objects.select_related("route", "fulfillment").get(pk=intent.pk), driven)


def _another_payment(intent: PaymentIntent) -> JsonResponse:
    return problem(422, "idempotency-key-reused", "This Idempotency-Key already carries a payment",
                   f"{intent.intent_id} is paid by the authorization presented first; a different "
                   f"PAYMENT-SIGNATURE is never taken for it (replay the first one, or none)",
                   intent_id=intent.intent_id)


def _challenge(intent: PaymentIntent, cause: Cause, access: ApiAccess, resource: str) -> HttpResponse:
    if intent.state == "created":
        outcome = authorize.onchain_challenge(intent=intent, cause=cause, access=access, resource=resource)
        if not outcome.accepted:
            return _refused(intent, outcome.refusal_code, outcome.detail)
        if outcome.lines.intent == "challenged":  # the hot path: the 402 from the row just written
            challenge = PaymentChallenge.objects.select_related("network").get(intent_id=intent.pk)
            return _payment_required(intent.intent_id, challenge, display_status(outcome.lines))
    elif authorize.onchain_expire_challenge(intent=intent, cause=cause) is not None:
        intent.refresh_from_db(fields=["state"])
    return _render(PaymentIntent.objects.select_related("route", "fulfillment").get(pk=intent.pk), None)


def _refused(intent: PaymentIntent, code: str, detail: str) -> JsonResponse:
    if code == "NO_CHAIN_NETWORK":
        return problem(503, "rail-not-available", "The on-chain rail is not available for this route", detail,
                       intent_id=intent.intent_id)
    return problem(409, "refused", "The intent could not take this step", detail, code=code,
                   intent_id=intent.intent_id)


def _not_authorized(intent: PaymentIntent, presented: authorize.Presented) -> HttpResponse:
    if presented.status == authorize.UNREADABLE:
        fresh = PaymentIntent.objects.select_related("route", "fulfillment").get(pk=intent.pk)
        return problem(400, "payment-signature-malformed", "PAYMENT-SIGNATURE could not be read",
                       presented.detail, reason=presented.reason, intent_id=intent.intent_id,
                       headers={**_ids(fresh), **_challenge_header(fresh)})
    if presented.status == authorize.CHAIN_UNAVAILABLE:
        return problem(503, "chain-unavailable", "The payment could not be checked on chain",
                       f"{presented.detail}; nothing was decided: retry with the same Idempotency-Key and "
                       f"PAYMENT-SIGNATURE", reason=presented.reason, intent_id=intent.intent_id,
                       headers={"Retry-After": "2"})
    if presented.status == authorize.REFUSED and presented.outcome is not None and \
            presented.outcome.lines.intent in ("created", "challenged"):
        return _refused(intent, presented.outcome.refusal_code, presented.detail)
    return _render(PaymentIntent.objects.select_related("route", "fulfillment").get(pk=intent.pk), None)


def _ids(intent: PaymentIntent, view: dict[str, Any] | None = None) -> dict[str, str]:
    view = view or intent_composite_view(intent)
    return {"AgentPay-Intent": intent.intent_id, "AgentPay-Display-Status": view["display_status"],
            "Access-Control-Expose-Headers": EXPOSED}


def _challenge_header(intent: PaymentIntent) -> dict[str, str]:
    if intent.state != "challenged":
        return {}
    challenge = PaymentChallenge.objects.filter(intent=intent).only("requirement").first()
    return {PAYMENT_REQUIRED: encode_payment_required_document(challenge.requirement)} if challenge else {}


def _payment_required(intent_id: str, challenge: PaymentChallenge, status: str) -> JsonResponse:
    code, slug = PAYMENT_REQUIRED_ANSWER  # the request log may have written it with the open's row
    return problem(code, slug, "Payment required",
                   f"pay {challenge.amount} atomic units of {challenge.asset} to {challenge.pay_to} on "
                   f"{challenge.network.caip2}: sign the PAYMENT-REQUIRED terms (EIP-3009) and send them as "
                   f"PAYMENT-SIGNATURE with the same Idempotency-Key before {challenge.expires_at.isoformat()}",
                   intent_id=intent_id, display_status=status,
                   headers={"AgentPay-Intent": intent_id, "AgentPay-Display-Status": status,
                            "Access-Control-Expose-Headers": EXPOSED,
                            PAYMENT_REQUIRED: _payment_required_header(challenge)})


def _payment_required_header(challenge: PaymentChallenge) -> str:
    """The challenge's PAYMENT-REQUIRED: as its issuing kept it (x402_effects), or from the stored document."""
    kept = getattr(challenge, "payment_required_header", None)
    return kept if kept is not None else encode_payment_required_document(challenge.requirement)


def _payment_response(intent: PaymentIntent, *, success: bool, error_reason: str | None = None) -> dict[str, str]:
    auth = ChainAuthorization.objects.select_related("network").filter(intent=intent).first()
    if auth is None:
        return {}
    tx = (ChainTransaction.objects.filter(settlement__intent=intent, purpose="settlement")
          .values_list("tx_hash", flat=True).first())
    return {PAYMENT_RESPONSE: encode_payment_response(
        success=success, transaction=tx or "", network=auth.network.caip2, payer=auth.payer, amount=int(auth.value),
        error_reason=error_reason)}


def _render(intent: PaymentIntent, driven: Driven | None) -> HttpResponse:
    """The answer for the intent as it is now; `driven`: what this request did (the upstream's
    answer, if it called it)."""
    view = intent_composite_view(intent)
    ids = _ids(intent, view)
    where = {"intent_id": intent.intent_id, "display_status": view["display_status"]}
    state, settlement = intent.state, view["settlement"]["state"]
    answer = driven.answer if driven is not None else None
    if state == "challenged":
        challenge = PaymentChallenge.objects.select_related("network").get(intent=intent)
        return _payment_required(intent.intent_id, challenge, view["display_status"])
    if state == "rejected":
        reason, detail = authorize.onchain_rejection(intent)
        if reason and reason.startswith(("tenant_", "entitlement_")):
            return problem(403, "policy-denied", "The tenant may not make this call", detail, reason=reason,
                           headers=ids, **where)
        return problem(402, "payment-invalid", "The payment is not valid",
                       f"{detail}; this Idempotency-Key is closed: a new payment needs a new key",
                       reason=reason, headers=ids, **where)
    if state == "expired":
        was_paid = ChainAuthorization.objects.filter(intent=intent).exists()
        slug, what = (("authorization-expired", "the signed authorization lapsed before it was settled; nothing "
                                                "was charged") if was_paid else
                      ("challenge-expired", "the challenge was not answered within its 300 s"))
        return problem(402, slug, "The payment window has passed", f"{what}; a new payment needs a new "
                                                                    f"Idempotency-Key", headers=ids, **where)
    if answer is not None and answer.outcome in ("2xx", "4xx") and driven.outcome is not None \
            and driven.outcome.accepted:
        response = HttpResponse(answer.body, status=answer.status,
                                content_type=answer.content_type or "application/octet-stream")
        for name, value in {**ids, **_payment_response(intent, success=True)}.items():
            response[name] = value
        if answer.outcome == "4xx":
            response["AgentPay-Refund"] = "required"  # paid on chain, not delivered: a refund is owed
        return response
    if answer is not None and answer.outcome in ("5xx", "timeout"):
        status = 502 if answer.outcome == "5xx" else 504
        what = f"the upstream answered {answer.status}" if answer.status else "the upstream gave no complete answer"
        return problem(status, "fulfillment-unknown", "The upstream's outcome is unknown",
                       f"{what} after the payment was confirmed on chain; whether it acted is unknown until its "
                       f"status query or a billing lead decides. Do not pay again with a new key",
                       headers={**ids, **_payment_response(intent, success=True)}, **where)
    if settlement == "failed":
        return problem(402, "settlement-failed", "The payment did not settle",
                       "the transfer was rejected or reverted on chain; nothing was charged or delivered",
                       headers={**ids, **_payment_response(intent, success=False, error_reason="settlement_failed")},
                       **where)
    if state == "authorized" and settlement in IN_FLIGHT:
        return JsonResponse(view, status=202, headers={
            **ids, "Location": f"/agentpay/v1/intents/{intent.intent_id}", "Retry-After": "2",
            "AgentPay-Advice": "replay this Idempotency-Key (with the same PAYMENT-SIGNATURE or none); never sign "
                               "a new payment for this call",
            **_payment_response(intent, success=False, error_reason="settlement_pending")})
    paid = settlement == "confirmed"
    return JsonResponse(view, headers={**ids, "Idempotent-Replayed": "true",
                                       **(_payment_response(intent, success=True) if paid else {})})
