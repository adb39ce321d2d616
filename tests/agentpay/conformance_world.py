"""The conformance runner's world: the hand-written vectors of
`agentpay/specs/conformance/state-machine.json`, and a builder that reaches a vector's `given`
through the real acceptance service.

The builder never writes a state: it opens the intent with `intent_open` and sends the real
events, one acceptance each, on the shortest path the seed's tables allow to the given states
(path below). Two things are arranged beside the intent, not on it: the wallet's counters
(staff credits, and another intent's open hold for pending debits that are not this intent's),
and the clock. Everything happens on a vector clock that starts three hours before the trusted
clock and moves one second per event, so an event whose `data` names an elapsed time (the
recovery deadline, a status query's distance from our closed connection, a crashed dispatcher's
age) is sent at exactly that distance from the moment it is measured from, and never ahead of
the trusted clock.

A settlement that must be `failed` (hold_failed) needs a wallet that cannot hold: the builder
freezes the wallet for that one step and unfreezes it, so the counters stay the vector's.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings

from agentpay.bridge import trusted_now
from agentpay.models import LedgerAccount, PaymentIntent, PricedRoute, Tenant, Transfer
from agentpay.services.acceptance import intent_accept
from agentpay.services.intents import intent_open, request_digest
from agentpay.services.results import Cause, Outcome, Step
from agentpay.services.tenants import tenant_create
from agentpay.services.topups import wallet_staff_credit

SPEC_DIR = Path(settings.BASE_DIR) / "agentpay" / "specs" / "conformance"
SPEC = json.loads((SPEC_DIR / "state-machine.json").read_text())
SCHEMA = json.loads((SPEC_DIR / "state-machine.schema.json").read_text())
VECTORS = SPEC["vectors"] + SPEC["negatives"]
WALLET_VECTORS = [v for v in VECTORS if v["rail"] == "wallet"]
ONCHAIN_VECTORS = [v for v in VECTORS if v["rail"] == "onchain"]
# The file names the intent line `payment_intent`; the code calls it `intent`.
LINE = {"payment_intent": "intent", "settlement": "settlement", "fulfillment": "fulfillment"}
SPEC_LINE = {code: spec for spec, code in LINE.items()}
LEDGER_KIND = {"pending": "HOLD", "post_pending": "CAPTURE", "void_pending": "RELEASE", "posted": "CREDIT"}
DEFAULT_PRICE = SPEC["constants"]["default_price"]
DEADLINE = SPEC["constants"]["recovery_deadline_seconds"] + 1
HOLD_TTL = SPEC["constants"]["undispatched_hold_ttl_seconds"] + 1


@dataclass
class Clock:
    now: datetime = field(default_factory=lambda: trusted_now() - timedelta(hours=3))

    def tick(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now


@dataclass
class Actors:
    lead: Any  # a billing lead (resolve_review, credit_wallet)
    agent: Any  # a support agent: staff, no AgentPay permission

    def cause(self, data: dict[str, Any]) -> Cause:
        role = data.get("actor_role")
        if role in ("billing_lead", "support_agent"):
            user = self.lead if role == "billing_lead" else self.agent
            return Cause.person(user, reason=data.get("reason", ""), ticket=data.get("ticket", ""))
        return Cause.system("conformance")


def price_of(vector: dict[str, Any]) -> dict[str, Any]:
    return vector["given"].get("price") or DEFAULT_PRICE


def wallet_spec(vector: dict[str, Any]) -> dict[str, Any]:
    return vector["given"].get("wallet") or {"currency": DEFAULT_PRICE["currency"], "credits_posted": 1000,
                                             "debits_posted": 0, "debits_pending": 0}


def make_route(slug: str, *, price: int, currency: str, base_url: str, path: str = "/code/200",
               connect_timeout: float = 1.0, read_timeout: float = 5.0) -> PricedRoute:
    return PricedRoute.objects.create(
        slug=slug, name=slug, upstream_base_url=base_url, upstream_path=path, method="POST", price_minor=price,
        currency=currency.lower(), rails_allowed=["wallet"], connect_timeout_seconds=connect_timeout,
        read_timeout_seconds=read_timeout, status_query_url=f"{base_url}/status", fences_not_found=True)


def accept(intent: PaymentIntent, line: str, event: str, data: dict[str, Any] | None = None, *,
           cause: Cause | None = None, now: datetime) -> Outcome:
    return intent_accept(intent_id=intent.intent_id, steps=[Step(line, event, dict(data or {}))],
                         cause=cause or Cause.system("conformance builder"), now=now)


def must(outcome: Outcome) -> Outcome:
    assert outcome.accepted, f"builder step refused: {outcome.refusal_code} {outcome.detail}"
    return outcome


def path_to(given: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """The real events from created to the given (intent, settlement, fulfillment), wallet rail."""
    i, s, f = given["intent"], given["settlement"], given["fulfillment"]
    steps: list[tuple[str, str, dict[str, Any]]] = []
    if i == "created":
        return steps
    if i == "rejected":
        return [("intent", "policy_denied", {"reason": "risk_block"})]
    steps.append(("intent", "payload_verified", {}))
    if s == "failed":
        steps.append(("settlement", "hold_failed", {"reason": "account_frozen"}))
        return steps + ([("intent", "settlement_failed", {})] if i == "failed" else [])
    if s == "not_started":  # expired: authorized, never held, past the TTL (C14)
        return steps + ([("intent", "hold_expired", {"seconds_authorized": HOLD_TTL})] if i == "expired" else [])
    steps.append(("settlement", "hold_acquired", {}))
    if f == "not_started" and s == "released":  # a never-dispatched hold that expired (C14)
        steps.append(("settlement", "hold_expired", {"seconds_held": HOLD_TTL}))
        return steps + ([("intent", "hold_expired", {})] if i == "expired" else [])
    if f == "not_started":
        return steps
    steps.append(("fulfillment", "dispatch", {}))
    if f == "in_progress":
        return steps
    if f == "unknown" or i == "needs_review":
        steps.append(("fulfillment", "upstream_5xx", {"status": 500}))
        if i == "needs_review":
            steps += [("fulfillment", "recovery_deadline_exceeded", {"elapsed_seconds": DEADLINE}),
                      ("intent", "recovery_deadline_exceeded", {"elapsed_seconds": DEADLINE})]
        if f in ("succeeded", "failed"):
            event = "upstream_status_query_ok" if f == "succeeded" else "upstream_status_query_failed"
            steps.append(("fulfillment", event, {"source": "status_query", "answer": f}))
    else:
        steps.append(("fulfillment", "upstream_2xx" if f == "succeeded" else "upstream_4xx",
                      {"status": 200 if f == "succeeded" else 400}))
    if s in ("confirmed", "released"):
        steps.append(("settlement", "capture" if s == "confirmed" else "release", {}))
    if i == "completed":
        steps.append(("intent", "settlement_confirmed", {}))
    elif i == "failed":
        steps.append(("intent", "settlement_released", {}))
    return steps


def event_time(intent: PaymentIntent, data: dict[str, Any], clock: Clock) -> datetime:
    """When an event is sent: at the distance its data names from what it is measured from."""
    fulfillment = intent.fulfillment
    fulfillment.refresh_from_db()
    intent.refresh_from_db(fields=["state", "state_changed_at"])
    settlement = intent.settlements.order_by("-pk").select_related("hold").first()
    for key, anchor in (("elapsed_seconds", fulfillment.unknown_since or intent.challenged_at),
                        ("seconds_held", settlement.hold.created_at if settlement and settlement.hold else None),
                        ("seconds_authorized", intent.state_changed_at if intent.state == "authorized" else None),
                        ("seconds_since_connection_closed", fulfillment.unknown_since),
                        ("seconds_in_progress", fulfillment.dispatched_at)):
        if key in data and anchor is not None:
            # Exactly there, even if an earlier event of the vector was later (negatives list
            # independent tries: N52 asks at 3600 s, then at 3 s).
            return anchor + timedelta(seconds=data[key])
    return clock.tick()


@dataclass
class Built:
    tenant: Tenant
    route: PricedRoute
    intent: PaymentIntent | None
    wallet: LedgerAccount
    key: str
    body: bytes


def build(vector: dict[str, Any], actors: Actors, clock: Clock, *, base_url: str, route_path: str = "/code/200",
          route_timeouts: tuple[float, float] = (1.0, 5.0), open_intent: bool = True) -> Built:
    """The vector's world: tenant, wallet counters, route, and (unless `open_intent` is false) the
    intent driven to `given` by real events."""
    tag = uuid.uuid4().hex[:8]
    given, price, wallet = vector["given"], price_of(vector), wallet_spec(vector)
    tenant = tenant_create(name=f"{vector['id']} {tag}", currency=wallet["currency"])
    account = LedgerAccount.objects.get(kind="wallet", tenant=tenant)
    if wallet.get("credits_posted"):
        wallet_staff_credit(tenant=tenant, currency=account.currency, amount=wallet["credits_posted"],
                            user=actors.lead, reason="conformance float", ticket=vector["id"], now=clock.tick())
    route = make_route(f"c-{vector['id'].lower()}-{tag}", price=price["amount"], currency=price["currency"],
                       base_url=base_url, path=route_path, connect_timeout=route_timeouts[0],
                       read_timeout=route_timeouts[1])
    own_hold = price["amount"] if given["settlement"] == "held" else 0
    other_pending = wallet.get("debits_pending", 0) - own_hold
    if other_pending > 0:  # pending debits that are another call's open hold
        _other_hold(tenant, other_pending, clock, base_url)
    idem = given.get("idempotency") or {}
    key = idem.get("key") or f"{vector['id']}-{tag}"
    body = json.dumps({"vector": vector["id"], "digest": idem.get("request_digest", "")}).encode()
    intent = None
    if open_intent:
        intent = _open(tenant, route, key, body, clock)
        for line, event, data in path_to(given):
            now = event_time(intent, data, clock)
            if event == "hold_failed":
                LedgerAccount.objects.filter(pk=account.pk).update(frozen=True)
            try:
                must(accept(intent, line, event, data, now=now))
            finally:
                if event == "hold_failed":
                    LedgerAccount.objects.filter(pk=account.pk).update(frozen=False)
        intent.refresh_from_db()
    if wallet.get("frozen"):
        LedgerAccount.objects.filter(pk=account.pk).update(frozen=True)
    account.refresh_from_db()
    return Built(tenant, route, intent, account, key, body)


def _open(tenant: Tenant, route: PricedRoute, key: str, body: bytes, clock: Clock) -> PaymentIntent:
    digest = request_digest(method="POST", route_slug=route.slug, path="run", query="",
                            content_type="application/json", body=body)
    return intent_open(tenant=tenant, route=route, rail="wallet", idempotency_key=key, digest=digest,
                       forward_path="run", forward_query="", content_type="application/json", body=body,
                       request_id=uuid.uuid4(), now=clock.tick()).intent


def _other_hold(tenant: Tenant, amount: int, clock: Clock, base_url: str) -> None:
    route = make_route(f"c-other-{uuid.uuid4().hex[:8]}", price=amount,
                       currency=LedgerAccount.objects.get(kind="wallet", tenant=tenant).currency, base_url=base_url)
    other = _open(tenant, route, f"other-{uuid.uuid4().hex[:8]}", b"{}", clock)
    must(accept(other, "intent", "payload_verified", now=clock.tick()))
    must(accept(other, "settlement", "hold_acquired", now=clock.tick()))


def lines_now(intent: PaymentIntent) -> dict[str, str]:
    intent.refresh_from_db()
    intent.fulfillment.refresh_from_db()
    return {"intent": intent.state, "settlement": intent.settlements.order_by("-pk").first().state,
            "fulfillment": intent.fulfillment.state}


def ledger_of(intent: PaymentIntent) -> list[str]:
    return [LEDGER_KIND[k] for k in Transfer.objects.filter(intent=intent).order_by("pk").values_list("kind",
                                                                                                      flat=True)]


def wallet_counters(account: LedgerAccount) -> dict[str, int]:
    account.refresh_from_db()
    return {"credits_posted": account.credits_posted, "debits_posted": account.debits_posted,
            "debits_pending": account.debits_pending, "available": account.available,
            "frozen": account.frozen}
