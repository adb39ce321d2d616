"""The gateway (`/agentpay/v1/routes/<route>/<path>`) and the intent read (`/agentpay/v1/intents/<pi_id>`).

Thin edges: parse and check the input, then call the services. Every refusal is a problem
document; nothing here answers 500 for bad input.
"""

from __future__ import annotations

import json
import re
from typing import Any

from django.http import HttpResponse, JsonResponse
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.views import APIView

from agentpay.api.auth import IsTenant, TenantApiKeyAuthentication
from agentpay.api.front import MAX_SLUG
from agentpay.api.onchain import onchain_call
from agentpay.api.problems import agentpay_exception_handler, problem
from agentpay.api.request_log import (
    PAYMENT_REQUIRED_ANSWER,
    request_log_answer,
    request_log_answered,
    request_log_expect,
    request_log_write,
)
from agentpay.api.schema import COMPOSITE_VIEW, GATEWAY_ERRORS, PROBLEM, SETTLEMENT_IN_PROGRESS
from agentpay.bridge import api_access_for, trusted_now
from agentpay.composite import display_status_or_violation
from agentpay.models import PaymentIntent, PricedRoute
from agentpay.selectors import intent_composite_view
from agentpay.services.intents import intent_claim_lease, intent_open, intent_release_lease, request_digest
from agentpay.services.onchain_authorize import onchain_policy_refusal
from agentpay.services.results import Cause, RequestAnswer, Step
from agentpay.services.wallet_flow import Driven, intent_drive_wallet, open_steps
from agentpay.states import INTENT, INTENT_TERMINAL, ONCHAIN, WALLET
from agentpay.upstream import UpstreamAnswer
from agentpay.x402.headers import PAYMENT_SIGNATURE
from config.json_depth import MAX_JSON_DEPTH, json_nesting_exceeds

MAX_KEY_LENGTH = 255
_KEY = re.compile(r"^[\x21-\x7e]+$")  # visible ASCII, no spaces
_AMOUNT = re.compile(r"^[0-9]{1,18}$")
JSON_TYPES = ("application/json",)


class _AgentPayView(APIView):
    authentication_classes = [TenantApiKeyAuthentication]
    permission_classes = [IsTenant]
    throttle_classes: list = []
    parser_classes: list = []  # the gateway forwards bodies as they came; it never parses them for DRF

    def get_exception_handler(self):  # noqa: ANN201
        return agentpay_exception_handler


def _check_call(request: Request, route: PricedRoute, subpath: str) -> tuple[JsonResponse | None, str, str]:
    """(a problem answer or None, the idempotency key, the rail)."""
    key = request.headers.get("Idempotency-Key")
    if not key:
        return problem(400, "idempotency-key-required", "Idempotency-Key is required",
                       "every priced call carries a tenant-unique Idempotency-Key"), "", ""
    if len(key) > MAX_KEY_LENGTH:
        return problem(400, "idempotency-key-too-long", "Idempotency-Key is too long",
                       f"at most {MAX_KEY_LENGTH} characters; got {len(key)}"), "", ""
    if not _KEY.match(key):
        return problem(400, "idempotency-key-invalid", "Idempotency-Key is not valid",
                       "visible ASCII characters only (no spaces, no control characters)"), "", ""
    if "\x00" in subpath:
        return problem(400, "malformed-request", "The path is not valid", "the path contains a NUL"), "", ""
    amount = request.headers.get("AgentPay-Amount")
    if amount is not None:
        if not _AMOUNT.match(amount.strip()):
            return problem(400, "invalid-amount", "AgentPay-Amount is not valid",
                           f"a non-negative whole number of minor units; got {amount[:40]!r}"), "", ""
        if int(amount) != route.price_minor:
            return problem(422, "amount-mismatch", "The amount does not match the route's price",
                           f"the route costs {route.price_minor} {route.currency}; you offered {int(amount)}",
                           price=route.price_minor, currency=route.currency), "", ""
    currency = request.headers.get("AgentPay-Currency")
    if currency is not None and currency.strip().lower() != route.currency:
        return problem(422, "currency-mismatch", "The currency does not match the route's",
                       f"the route is priced in {route.currency}; you asked for {currency[:16]!r}"), "", ""
    # No rail header: the wallet, unless the chain is the route's only rail (an x402 client sends none).
    default = ONCHAIN if list(route.rails_allowed) == [ONCHAIN] else WALLET
    rail = (request.headers.get("AgentPay-Rail") or default).strip().lower()
    if rail not in route.rails_allowed:
        return problem(422, "rail-not-allowed", "This route does not take that rail",
                       f"rails allowed: {', '.join(route.rails_allowed) or 'none'}; asked: {rail[:16]!r}"), "", ""
    if rail == ONCHAIN and (route.network is None or not route.network.active):
        # Never a silent fallback to the other rail: the agent chose the chain, the chain it is.
        return problem(503, "rail-not-available", "The on-chain rail is not available for this route",
                       "the route has no active chain network; pay with the wallet rail (AgentPay-Rail: wallet) "
                       "if the route takes it"), "", ""
    content_type = request.headers.get("Content-Type", "")
    body = request.body
    if body and content_type.split(";")[0].strip().lower() in JSON_TYPES:
        if json_nesting_exceeds(body):
            return problem(400, "malformed-json", "The JSON body could not be parsed",
                           f"nested more than {MAX_JSON_DEPTH} levels deep"), "", ""
        try:
            json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            return problem(400, "malformed-json", "The JSON body could not be parsed", str(exc)[:200]), "", ""
    return None, key, rail


class RouteCallView(_AgentPayView):
    """Call a priced route: the wallet pays, the upstream answers."""

    reads_route = True  # the authentication reads the URL's route with the key (agentpay.api.front)

    @extend_schema(
        operation_id="agentpay_route_call",
        summary="Call a priced upstream route (pay per call from the tenant's wallet, or on chain by x402)",
        description=(
            "Forwards the call to the route's upstream with `Idempotency-Key: ful_…` after a hold on the wallet. "
            "2xx: captured, upstream answer relayed. 4xx: released (unbilled), relayed. 5xx / timeout: 502 / 504 "
            "problem, outcome unknown, hold kept. A replay of the same key answers the intent's composite view. "
            "On-chain (x402 v2): 402 + PAYMENT-REQUIRED, then the same key with PAYMENT-SIGNATURE settles first "
            "and calls the upstream after confirmation; PAYMENT-RESPONSE on the answer; 202 while the settlement "
            "is undecided (never 402 once authorized)."),
        parameters=[
            OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER, required=True,
                             description="Tenant-unique, at most 255 visible ASCII characters."),
            OpenApiParameter("AgentPay-Amount", int, OpenApiParameter.HEADER,
                             description="The price the agent expects (minor units); must equal the route's."),
            OpenApiParameter("AgentPay-Currency", str, OpenApiParameter.HEADER),
            OpenApiParameter("AgentPay-Rail", str, OpenApiParameter.HEADER, enum=["wallet", "onchain"],
                             description="Default: wallet, or onchain on a route whose only rail is onchain."),
            OpenApiParameter("PAYMENT-SIGNATURE", str, OpenApiParameter.HEADER,
                             description="On-chain (x402 v2): base64 JSON PaymentPayload answering the 402's "
                                         "PAYMENT-REQUIRED (EIP-3009 transferWithAuthorization, scheme exact)."),
        ],
        request={"application/json": {"type": "object"}, "application/octet-stream": {"type": "string"}},
        responses={200: OpenApiResponse(COMPOSITE_VIEW, description="The upstream's 2xx answer, or a replay's "
                                                                    "composite view"),
                   202: SETTLEMENT_IN_PROGRESS, **GATEWAY_ERRORS},
    )
    def post(self, request: Request, route: str, subpath: str = "") -> HttpResponse:
        return self._call(request, route, subpath)

    @extend_schema(operation_id="agentpay_route_call_get", summary="Call a priced GET route",
                   responses={200: COMPOSITE_VIEW, **GATEWAY_ERRORS})
    def get(self, request: Request, route: str, subpath: str = "") -> HttpResponse:
        return self._call(request, route, subpath)

    def put(self, request: Request, route: str, subpath: str = "") -> HttpResponse:
        return self._call(request, route, subpath)

    def patch(self, request: Request, route: str, subpath: str = "") -> HttpResponse:
        return self._call(request, route, subpath)

    def delete(self, request: Request, route: str, subpath: str = "") -> HttpResponse:
        return self._call(request, route, subpath)

    def _call(self, request: Request, slug: str, subpath: str) -> HttpResponse:
        tenant = request.user.tenant
        front = getattr(request._request, "agentpay_front", None)  # read with the API key (auth.py)
        wallet_read = None
        if front is not None and front[0] == slug:
            priced, wallet_read = front[1], front[2]
        else:  # the network with it: _check_call and the challenge read it
            priced = (PricedRoute.objects.select_related("network").filter(slug=slug, active=True).first()
                      if len(slug) <= MAX_SLUG else None)
        if priced is None:
            return problem(404, "unknown-route", "No such priced route", f"no active route {slug[:64]!r}")
        request._request.agentpay_route = priced
        if request.method != priced.method:
            return problem(405, "method-not-allowed", "Method not allowed",
                           f"route {priced.slug} takes {priced.method}", headers={"Allow": priced.method})
        refused, key, rail = _check_call(request, priced, subpath)
        if refused is not None:
            return refused
        request_id = request._request.agentpay_request_id
        query = request.META.get("QUERY_STRING", "")
        content_type = request.headers.get("Content-Type", "")
        digest = request_digest(method=request.method, route_slug=priced.slug, path=subpath, query=query,
                                content_type=content_type, body=request.body)
        now = trusted_now()
        access = api_access_for(tenant.subscription_ref, method=request.method)
        steps: list[Step] = []
        lease = True
        # The first steps are taken as the intent is opened (one transaction) when no policy refuses:
        # the tenant's status is the one the API-key read loaded for this request; a refusal goes the
        # acceptance's way (policy_denied), and so does an effect's (too little balance, no network).
        if not onchain_policy_refusal(tenant.status, access)[0]:
            if rail == ONCHAIN:
                steps = [Step(INTENT, "challenge_issued", {"resource": request.build_absolute_uri()})]
                lease = PAYMENT_SIGNATURE in request.headers  # an unpaid call's 402 is the whole answer
            else:
                steps = open_steps(priced.price_minor)
        log = getattr(request._request, "agentpay_log", None)  # the request's row, unless written already
        if log is not None and not request._request.agentpay_logged:
            log.tenant, log.route = tenant, priced
            if rail == ONCHAIN and steps and not lease:  # unpaid: opened challenged, the 402 is the answer
                request_log_expect(request._request, PAYMENT_REQUIRED_ANSWER)
        else:
            log = None
        opened = intent_open(tenant=tenant, route=priced, rail=rail, idempotency_key=key, digest=digest,
                             forward_path=subpath, forward_query=query, content_type=content_type, body=request.body,
                             request_id=request_id, now=now, steps=steps, lease=lease, log=log,
                             wallet_read=wallet_read)
        intent = opened.intent
        request._request.agentpay_intent = intent
        if log is not None:
            request._request.agentpay_logged = opened.logged
            request_log_write(request._request)  # the key found an intent: the row before anything else
        if not opened.created and intent.request_digest != digest:
            return problem(422, "idempotency-key-reused", "Idempotency-Key was used for a different request",
                           f"the key belongs to {intent.intent_id}, made with a different request",
                           intent_id=intent.intent_id)
        if intent.rail == ONCHAIN:
            return onchain_call(request, intent=intent, created=opened.created,
                                cause=Cause.request(request_id, tenant.tenant_id), access=access)
        if not opened.created:
            resumable = intent.state not in INTENT_TERMINAL and intent.fulfillment.state == "not_started"
            if not resumable or not intent_claim_lease(intent=intent, now=now):
                if intent.processing_until is not None and intent.processing_until > now:
                    return problem(409, "idempotency-in-flight", "A request with this Idempotency-Key is in flight",
                                   "retry after it has finished; the replay will show its outcome",
                                   intent_id=intent.intent_id, headers={"Retry-After": "1"})
                return _replay(intent)
        released = False

        def relayed(upstream: UpstreamAnswer) -> RequestAnswer | None:
            # An accepted 2xx or 4xx is relayed as it came (_relayed): the row takes that answer.
            if upstream.outcome not in ("2xx", "4xx") or upstream.status is None:
                return None
            return request_log_answer(request._request, (upstream.status, ""))

        try:
            driven = intent_drive_wallet(intent=intent, cause=Cause.request(request_id, tenant.tenant_id),
                                         access=access, request_id=request_id, just_opened=opened.created,
                                         opened_lines=opened.lines, opened_settlement=opened.settlement,
                                         release_lease=True, answered=relayed)
            released = driven.lease_released
            request_log_answered(request._request, driven.answer_logged)
        finally:
            if not released:
                intent_release_lease(intent=intent)
        if _relayable(driven):  # the upstream's answer, the lines from the acceptance: nothing to read
            return _relayed(intent.intent_id, display_status_or_violation(driven.outcome.lines), driven.answer)
        # One read of what the answer shows (the acceptances committed it).
        intent = PaymentIntent.objects.select_related("route", "fulfillment").get(pk=intent.pk)
        return _answer(intent, driven)


# Why the wallet flow stopped short → (status, problem slug, title, advice). The spec's C07.
REFUSAL_ANSWERS = {
    "POLICY_DENIED": (403, "policy-denied", "The tenant may not make this call", ""),
    "CURRENCY_MISMATCH": (422, "currency-mismatch", "The route's currency has no wallet", ""),
    "NO_WALLET": (402, "no-wallet", "The tenant has no wallet", "; ask support to set the wallet up"),
    "INSUFFICIENT_BALANCE": (402, "insufficient-balance", "Insufficient balance",
                             "; top up the wallet (no on-chain payment was attempted)"),
    "WALLET_FROZEN": (403, "wallet-frozen", "The wallet is frozen", "; ask support (no on-chain payment was "
                                                                    "attempted)"),
}


def _replay(intent: PaymentIntent) -> JsonResponse:
    view = intent_composite_view(intent)
    return JsonResponse(view, headers={"Idempotent-Replayed": "true", "AgentPay-Intent": intent.intent_id,
                                       "AgentPay-Display-Status": view["display_status"]})


def _relayable(driven: Driven) -> bool:
    """The upstream answered 2xx or 4xx and its capture or release was accepted."""
    answer = driven.answer
    return answer is not None and answer.outcome in ("2xx", "4xx") and driven.outcome.accepted


def _relayed(intent_id: str, status: str, answer: UpstreamAnswer) -> HttpResponse:
    response = HttpResponse(answer.body, status=answer.status,
                            content_type=answer.content_type or "application/octet-stream")
    response["AgentPay-Intent"], response["AgentPay-Display-Status"] = intent_id, status
    return response


def _answer(intent: PaymentIntent, driven: Driven) -> HttpResponse:
    view = intent_composite_view(intent)
    ids_headers = {"AgentPay-Intent": intent.intent_id, "AgentPay-Display-Status": view["display_status"]}
    where: dict[str, Any] = {"intent_id": intent.intent_id, "display_status": view["display_status"]}
    if driven.refusal in REFUSAL_ANSWERS:
        # seed §1: none of these falls back to the chain, and none carries PAYMENT-REQUIRED.
        status, slug, title, advice = REFUSAL_ANSWERS[driven.refusal]
        return problem(status, slug, title, driven.detail + advice, headers=ids_headers, **where)
    answer = driven.answer
    if _relayable(driven):
        return _relayed(intent.intent_id, view["display_status"], answer)
    if answer is not None and answer.outcome in ("5xx", "timeout"):
        status = 502 if answer.outcome == "5xx" else 504
        what = f"the upstream answered {answer.status}" if answer.status else f"the upstream gave no answer " \
                                                                              f"({answer.error[:120]})"
        return problem(status, "fulfillment-unknown", "The upstream's outcome is unknown",
                       f"{what}; whether it acted is unknown, so the hold of {intent.amount} {intent.currency} is "
                       f"kept and nothing is billed until its status query or a billing lead decides",
                       headers=ids_headers, fulfillment_id=view["fulfillment"]["fulfillment_id"],
                       hold_id=view["settlement"]["hold_id"], **where)
    if driven.outcome is not None and not driven.outcome.accepted:
        return problem(409, "refused", "The intent could not take this step", driven.outcome.detail,
                       code=driven.outcome.refusal_code, headers=ids_headers, **where)
    return _replay(intent)


class IntentDetailView(_AgentPayView):
    @extend_schema(operation_id="agentpay_intent_retrieve", summary="The intent's composite view",
                   responses={200: COMPOSITE_VIEW, 401: PROBLEM, 404: PROBLEM})
    def get(self, request: Request, intent_id: str) -> JsonResponse:
        intent = (PaymentIntent.objects.select_related("route", "fulfillment")
                  .filter(intent_id=intent_id[:40], tenant=request.user.tenant).first())
        if intent is None:  # another tenant's intent is the same 404 as a missing one
            return problem(404, "not-found", "No such intent", f"no intent {intent_id[:40]!r} for this tenant")
        return JsonResponse(intent_composite_view(intent))
