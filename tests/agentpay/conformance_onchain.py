"""The on-chain half of the conformance runner's world (issue 18): a vector's `given` reached
through the real acceptance service on the on-chain rail, against the test chain.

As for the wallet (conformance_world), nothing writes a state: the intent is opened with
`intent_open` and the real events are sent, one acceptance each. The vectors name their events
abstractly ("payload_verified" with `eip3009: valid`, "submit_ok"); the evidence those events
need in this product is made real here, never skipped:

- `challenge_issued` writes its PaymentChallenge (x402's effect);
- `payload_verified` carries a real PAYMENT-SIGNATURE document: an EIP-3009 authorization
  signed by a funded payer with eth_account over the challenge's terms, valid until the
  challenge expires on the vector clock (the effect verifies it again);
- the first settlement event finds a real signed transaction persisted for the settlement
  (`settlement_sign`: the submitter's transferWithAuthorization, signed against the test chain's
  nonce and gas price) — it is never broadcast: the vector says what the chain answered;
- an `authorization_expired` is sent one second after the authorization's validBefore.

The vector clock (three hours behind the trusted clock) and elapsed-time anchors are the wallet
runner's; an on-chain recovery deadline counts from when the line became unknown (the
fulfillment's `recovery_deadline` less the deadline).
"""

from __future__ import annotations

import base64
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from eth_account import Account

from agentpay.chain.settlement import settlement_sign
from agentpay.models import ChainAuthorization, ChainTransaction, PaymentChallenge, PaymentIntent, PricedRoute
from agentpay.services.intents import intent_open, request_digest
from agentpay.services.results import Outcome
from agentpay.services.tenants import tenant_create
from tests.agentpay import conformance_world as cw
from tests.agentpay_x402.buyer import Buyer, decode

DEADLINE = cw.DEADLINE
CHALLENGE_TTL = cw.SPEC["constants"]["challenge_ttl_seconds"] + 1
LEAD = {"actor_role": "billing_lead", "reason": "conformance builder", "ticket": "CONF-1"}
SETTLEMENT_EVENTS_NEEDING_TX = frozenset({
    "submit_ok", "submit_rejected_definitely", "submit_timeout", "seen_on_chain", "query_timeout",
    "confirmations_reached", "reverted", "query_found_confirmed", "query_found_failed", "query_found_pending",
    "query_still_unknown"})


def path_to(given: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """The real events from created to the given (intent, settlement, fulfillment), on-chain."""
    i, s, f = given["intent"], given["settlement"], given["fulfillment"]
    if i == "created":
        return []
    if i == "rejected":
        return [("intent", "policy_denied", {"reason": "risk_block"})]
    steps: list[tuple[str, str, dict[str, Any]]] = [("intent", "challenge_issued", {})]
    if i == "challenged":
        return steps
    if i == "expired":  # the challenge TTL passed (an expired authorization is a vector's own event)
        return steps + [("intent", "timeout", {"elapsed_seconds": CHALLENGE_TTL})]
    steps.append(("intent", "payload_verified", {"scheme": "exact", "eip3009": "valid"}))
    if s == "not_started":
        return steps
    review = [("intent", "recovery_deadline_exceeded", {"elapsed_seconds": DEADLINE})]
    if s == "submitted":
        return steps + [("settlement", "submit_ok", {})]
    if s in ("pending", "unknown") and i == "needs_review":
        steps += [("settlement", "submit_timeout", {}), *review]
        return steps + ([("settlement", "query_found_pending", {})] if s == "pending" else [])
    if s == "pending":
        return steps + [("settlement", "submit_ok", {}), ("settlement", "seen_on_chain", {})]
    if s == "unknown":
        return steps + [("settlement", "submit_timeout", {})]
    if s == "failed":
        if i == "needs_review":
            return steps + [("settlement", "submit_timeout", {}), *review, ("settlement", "query_found_failed", {})]
        steps.append(("settlement", "submit_rejected_definitely", {"reason": "invalid_signature_at_node"}))
        return steps + ([("intent", "settlement_failed", {})] if i == "failed" else [])
    # confirmed
    if f == "not_started" and i in ("needs_review", "failed"):
        # Confirmed only after the review began (C09): never dispatched; a lead closes it with the refund.
        steps += [("settlement", "submit_timeout", {}), *review, ("settlement", "query_found_confirmed", {})]
        return steps + ([("intent", "manual_resolved_failed", {**LEAD, "refund_obligation": "recorded"})]
                        if i == "failed" else [])
    steps += [("settlement", "submit_ok", {}), ("settlement", "seen_on_chain", {}),
              ("settlement", "confirmations_reached", {"confirmations": 1, "required": 1})]
    if f == "not_started":
        return steps
    steps.append(("fulfillment", "dispatch", {}))
    if f == "in_progress":
        return steps
    if f == "unknown" or i == "needs_review":
        steps.append(("fulfillment", "upstream_5xx", {"status": 500}))
        if i == "needs_review":
            steps += [("fulfillment", "recovery_deadline_exceeded", {"elapsed_seconds": DEADLINE}), *review]
        if f in ("succeeded", "failed"):
            event = "upstream_status_query_ok" if f == "succeeded" else "upstream_status_query_failed"
            steps.append(("fulfillment", event, {"source": "status_query", "answer": f}))
        return steps
    steps.append(("fulfillment", "upstream_2xx" if f == "succeeded" else "upstream_4xx",
                  {"status": 200 if f == "succeeded" else 400}))
    if i == "completed":
        steps.append(("intent", "settlement_confirmed", {}))
    elif i == "failed":  # paid, not delivered: to review with its refund, closed by a lead
        steps += [*review, ("intent", "manual_resolved_failed", {**LEAD, "refund_obligation": "recorded"})]
    return steps


class OnchainWorld:
    """One vector's tenant, route, network and intent on the test chain."""

    def __init__(self, vector: dict[str, Any], actors: cw.Actors, clock: cw.Clock, *, chain: Any,
                 base_url: str) -> None:
        self.vector, self.actors, self.clock, self.chain = vector, actors, clock, chain
        tag = uuid.uuid4().hex[:8]
        price = cw.price_of(vector)
        self.network = chain.make_network(currency=price["currency"].lower())
        self.tenant = tenant_create(name=f"{vector['id']} {tag}", currency=price["currency"].lower())
        self.route = PricedRoute.objects.create(
            slug=f"c-{vector['id'].lower()}-{tag}", name=vector["id"], upstream_base_url=base_url,
            upstream_path="/code/200", method="POST", price_minor=price["amount"], currency=price["currency"].lower(),
            rails_allowed=["onchain"], network=self.network, connect_timeout_seconds=1.0, read_timeout_seconds=5.0,
            status_query_url=f"{base_url}/status", fences_not_found=True)
        self.buyer = Buyer(Account.from_key(chain.payers[0].key))
        body = json.dumps({"vector": vector["id"]}).encode()
        digest = request_digest(method="POST", route_slug=self.route.slug, path="run", query="",
                                content_type="application/json", body=body)
        self.intent: PaymentIntent = intent_open(
            tenant=self.tenant, route=self.route, rail="onchain", idempotency_key=f"{vector['id']}-{tag}",
            digest=digest, forward_path="run", forward_query="", content_type="application/json", body=body,
            request_id=uuid.uuid4(), now=clock.tick()).intent
        for line, event, data in path_to(vector["given"]):
            outcome = self.send(line, event, data)
            assert outcome.accepted, (f"{vector['id']} builder: {line}.{event} refused {outcome.refusal_code} "
                                      f"{outcome.detail}")
        self.intent.refresh_from_db()

    def realize(self, line: str, event: str, data: dict[str, Any], *, expected: bool) -> dict[str, Any]:
        """The vector's abstract data made into the evidence this product's effects check."""
        data = dict(data)
        if (line, event) == ("intent", "payload_verified") and self.intent.rail == "onchain":
            challenge = PaymentChallenge.objects.filter(intent=self.intent).first()
            if challenge is not None:
                required = base64.b64encode(json.dumps(challenge.requirement).encode()).decode()
                header = self.buyer.sign(required, valid_before=str(int(challenge.expires_at.timestamp())))
                data.update(payment_payload=decode(header), authorization_state="unused")
        if line == "settlement" and event in SETTLEMENT_EVENTS_NEEDING_TX and expected:
            settlement = self.intent.settlements.order_by("-pk").first()
            if not ChainTransaction.objects.filter(settlement=settlement).exists():
                settlement_sign(PaymentIntent.objects.get(pk=self.intent.pk), settlement, now=self.clock.now)
        return data

    def event_time(self, data: dict[str, Any], event: str) -> datetime:
        intent = self.intent
        intent.refresh_from_db()
        fulfillment = intent.fulfillment
        fulfillment.refresh_from_db()
        if event == "authorization_expired" and data.get("valid_before_passed"):
            authorization = ChainAuthorization.objects.filter(intent=intent).first()
            if authorization is not None:
                return datetime.fromtimestamp(int(authorization.valid_before), tz=UTC) + timedelta(seconds=1)
        if "elapsed_seconds" in data:
            deadline = settings.AGENTPAY_RECOVERY_DEADLINE_SECONDS
            anchor = (fulfillment.unknown_since
                      or (fulfillment.recovery_deadline - timedelta(seconds=deadline)
                          if fulfillment.recovery_deadline else None)
                      or intent.challenged_at)
            if anchor is not None:
                return anchor + timedelta(seconds=data["elapsed_seconds"])
        return self.clock.tick()

    def send(self, line: str, event: str, data: dict[str, Any] | None = None, *, expected: bool = True) -> Outcome:
        data = dict(data or {})
        cause = self.actors.cause(data)
        now = self.event_time(data, event)
        real = self.realize(line, event, data, expected=expected)
        return cw.accept(self.intent, line, event, real, cause=cause, now=max(now, self.clock.now))
