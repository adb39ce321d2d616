"""The Stripe HTTP API subset, transport-agnostic: ``StripeApi.handle(Request) -> Response``.

Order of work for one request: authenticate, route, consume a matching fault (a fault that does
not apply answers at once), honour the idempotency key (replay / mismatch / in flight), execute
under the state lock, store the result for the key, deliver auto-mode webhooks, and finally let
an applied fault replace the answer (hang and drop, or 500).
"""

from __future__ import annotations

import json
import re
import time
import traceback
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from tests.verification.fake_stripe.contract import CANCELED_IS_IMMUTABLE, ENDED_STATUSES, PAUSE_BEHAVIORS
from tests.verification.fake_stripe.core import SimulatorCore
from tests.verification.fake_stripe.errors import CardDeclined, InvalidTransition, SimError, not_found
from tests.verification.fake_stripe.idempotency import BUSY, MISMATCH, REPLAY, fingerprint
from tests.verification.fake_stripe.realism import rate_limit_answer
from tests.verification.fake_stripe.rendering import list_object

OBJECT_KINDS = {"payment_intents": "payment_intent", "charges": "charge", "disputes": "dispute",
                "refunds": "refund", "subscriptions": "subscription", "customers": "customer",
                "payment_methods": "payment_method", "setup_intents": "setup_intent", "products": "product"}
_ID = r"(?P<id>[^/]+)"
ROUTES = [
    ("GET", re.compile(r"^/v1/invoices$"), "list_invoices"),
    ("GET", re.compile(rf"^/v1/invoices/{_ID}$"), "get_invoice"),
    ("POST", re.compile(rf"^/v1/invoices/{_ID}/(?P<action>pay|void|finalize|mark_uncollectible)$"), "invoice_action"),
    ("GET", re.compile(r"^/v1/invoice_payments$"), "list_invoice_payments"),
    ("GET", re.compile(rf"^/v1/invoice_payments/{_ID}$"), "get_invoice_payment"),
    ("GET", re.compile(rf"^/v1/(?P<kind>{'|'.join(OBJECT_KINDS)})/{_ID}$"), "get_object"),
    ("GET", re.compile(rf"^/v1/(?:prices|plans)/{_ID}$"), "get_price"),
    ("DELETE", re.compile(rf"^/v1/subscriptions/{_ID}$"), "cancel_subscription"),
    ("POST", re.compile(rf"^/v1/subscriptions/{_ID}/resume$"), "resume_subscription"),
    ("POST", re.compile(rf"^/v1/subscriptions/{_ID}$"), "update_subscription"),
    ("GET", re.compile(r"^/v1/events$"), "list_events"),
    ("GET", re.compile(rf"^/v1/events/{_ID}$"), "get_event"),
]


@dataclass
class Request:
    method: str
    path: str
    query: str = ""
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


@dataclass
class Response:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    hang: float | None = None  # sleep this long, then close the connection without answering


def json_response(status: int, payload: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(status, json.dumps(payload, indent=2).encode("utf-8"), dict(headers or {}))


def parse_form(text: str) -> dict[str, Any]:
    """Stripe form encoding: ``a[b]=1``, ``expand[]=x``/``expand[0]=x`` (lists), ``created[gt]=5``."""
    root: dict[str, Any] = {}
    for key, value in parse_qsl(text, keep_blank_values=True):
        head, _, rest = key.partition("[")
        parts = [head] + (re.findall(r"([^\[\]]*)\]", "[" + rest) if rest else [])
        node = root
        for i, part in enumerate(parts):
            if part == "":
                part = str(len(node))
            if i == len(parts) - 1:
                node[part] = value
            else:
                child = node.get(part)
                if not isinstance(child, dict):
                    child = node[part] = {}
                node = child
    return {k: _listify(v) for k, v in root.items()}


def _listify(node: Any) -> Any:
    if not isinstance(node, dict):
        return node
    converted = {k: _listify(v) for k, v in node.items()}
    if converted and all(k.isdigit() for k in converted):
        return [converted[k] for k in sorted(converted, key=int)]
    return converted


def _expand(params: dict[str, Any]) -> list[str]:
    value = params.get("expand") or []
    return [value] if isinstance(value, str) else [str(v) for v in value]


def _flag(value: Any) -> bool:
    return str(value).lower() in ("true", "1", "yes")


def _pause_param(value: Any) -> dict[str, Any] | None:
    """``pause_collection=`` (empty: collection resumes) or ``pause_collection[behavior]=…``
    with an optional ``pause_collection[resumes_at]=<unix>``."""
    if value in ("", None):
        return None
    if not isinstance(value, dict):
        raise SimError(400, "Invalid pause_collection: send pause_collection[behavior] or an empty string.",
                       param="pause_collection")
    behavior = value.get("behavior")
    if not behavior:
        raise SimError(400, "Missing required param: pause_collection[behavior].", code="parameter_missing",
                       param="pause_collection[behavior]")
    if behavior not in PAUSE_BEHAVIORS:
        raise SimError(400, f"Invalid pause_collection[behavior]: must be one of {', '.join(PAUSE_BEHAVIORS)}",
                       param="pause_collection[behavior]")
    resumes_at = value.get("resumes_at")
    try:
        resumes = int(resumes_at) if resumes_at not in (None, "") else None
    except (TypeError, ValueError) as exc:
        raise SimError(400, "Invalid integer: pause_collection[resumes_at]", param="pause_collection[resumes_at]") \
            from exc
    return {"behavior": behavior, "resumes_at": resumes}


def _limit(params: dict[str, Any]) -> int:
    try:
        return max(1, min(100, int(params.get("limit", 10))))
    except (TypeError, ValueError) as exc:
        raise SimError(400, "Invalid integer: limit", param="limit") from exc


def _page(items: list[dict[str, Any]], params: dict[str, Any], url: str) -> dict[str, Any]:
    after = params.get("starting_after")
    if after:
        ids = [i["id"] for i in items]
        items = items[ids.index(after) + 1:] if after in ids else []
    limit = _limit(params)
    return list_object(items[:limit], url, has_more=len(items) > limit)


class StripeApi:
    def __init__(self, sim: SimulatorCore, control: Any = None, hosted: Any = None) -> None:
        self.sim = sim
        self.control = control
        self.hosted = hosted  # the provider-hosted invoice pages under /i/ (HostedPages), if served

    def handle(self, req: Request) -> Response:
        request_id = self.sim.store.new_id("request")
        # A real provider's round trip (`realism`; 0 unless switched on): half on the way in, half on
        # the way out, never under the simulator's lock, so concurrent requests overlap.
        api = not req.path.startswith(("/_sim/", "/i/"))
        delay = self.sim.network.draw_latency() if api else 0.0
        if delay:
            time.sleep(delay / 2)
        try:
            if req.path.startswith("/_sim/") and self.control is not None:
                response = self.control.handle(req)
            elif req.path.startswith("/i/") and self.hosted is not None:
                response = self.hosted.handle(req)
            else:
                response = self._handle_api(req, request_id)
        except SimError as exc:
            response = json_response(exc.status, exc.body())
        except Exception:  # a simulator bug must still look like a Stripe 500
            traceback.print_exc()
            response = json_response(500, {"error": {"type": "api_error", "message": "Simulator internal error."}})
        response.headers.setdefault("Request-Id", request_id)
        response.headers.setdefault("Content-Type", "application/json")
        if delay:
            time.sleep(delay / 2)
        return response

    def _handle_api(self, req: Request, request_id: str) -> Response:
        self._authenticate(req)
        method = req.method.upper()
        limited = self._rate_limited(method, req.path)
        if limited is not None:
            return limited
        route = next(((name, m) for verb, rx, name in ROUTES if verb == method and (m := rx.match(req.path))), None)
        if route is None:
            raise SimError(404, f"Unrecognized request URL ({method}: {req.path}). Please see https://stripe.com/docs "
                                "or we can help at https://support.stripe.com/.", code="resource_missing")
        name, match = route
        version = req.header("Stripe-Version") or self.sim.default_api_version
        params = parse_form(req.query)
        params.update(parse_form(req.body.decode("utf-8", "replace")))
        fault = self.sim.faults.take(method, req.path)
        if fault is not None and not fault.apply:
            return self._fault_response(fault)
        # Stripe keeps idempotency keys for POST only: a DELETE is idempotent by itself, and a key sent
        # with one is accepted and has no effect (cancelling twice answers 404 the second time).
        key = req.header("Idempotency-Key") if method == "POST" else None
        headers = {"Stripe-Version": version}
        if key:
            headers["Idempotency-Key"] = key
            fp = fingerprint(method, req.path, req.body, req.query)
            state, record = self.sim.idempotency.begin(key, fp)
            if state == REPLAY and record is not None:
                response = Response(record.status, record.body, {**headers, "Idempotent-Replayed": "true"})
            elif state == MISMATCH:
                raise SimError(400, "Keys for idempotent requests can only be used with the same parameters they were "
                                    f"first used with. Try using a key other than '{key}' if you meant to execute a "
                                    "different request.", type="idempotency_error")
            elif state == BUSY:
                raise SimError(409, "There is currently another in-progress request using this idempotent key (that "
                                    "probably means you submitted twice, and the other request is still going "
                                    f"through): {key}. Please try again later.", type="idempotency_error",
                               code="idempotency_key_in_use")
            else:
                try:
                    response = self._execute(name, match.groupdict(), params, version, request_id, key, req)
                except BaseException:
                    self.sim.idempotency.abandon(key)
                    raise
                if response.status >= 500:
                    self.sim.idempotency.abandon(key)
                else:
                    self.sim.idempotency.complete(key, fp, response.status, response.body)
                response.headers.update(headers)
        else:
            response = self._execute(name, match.groupdict(), params, version, request_id, None, req)
            response.headers.update(headers)
        if self.sim.auto_deliver:
            self.sim._flush_auto()
        return self._fault_response(fault) if fault is not None else response

    def _rate_limited(self, method: str, path: str) -> Response | None:
        """Stripe's limiter answers 429 before the request is routed or executed (nothing is applied,
        so a retry, of a write too, is safe): an armed ``rate_limit`` fault, or an empty token bucket."""
        fault = self.sim.faults.take(method, path, kinds=("rate_limit",))
        if fault is None and self.sim.network.admit(method):
            return None
        if fault is not None:
            self.sim.log(f"fault rate_limit on {fault.pattern}")
        retry_after = fault.retry_after if fault is not None else self.sim.network.profile.retry_after
        status, body, headers = rate_limit_answer(retry_after)
        return json_response(status, body, headers)

    def _authenticate(self, req: Request) -> None:
        auth = req.header("Authorization") or ""
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise SimError(401, "You did not provide an API key. You need to provide your API key in the Authorization "
                                "header, using Bearer auth (e.g. 'Authorization: Bearer YOUR_SECRET_KEY').")
        token = token.strip()
        allowed = self.sim.api_keys
        if (allowed is not None and token not in allowed) or not token.startswith(("sk_", "rk_")):
            raise SimError(401, f"Invalid API Key provided: {token[:8]}{'*' * max(0, len(token) - 12)}{token[-4:]}",
                           code="api_key_invalid")

    def _fault_response(self, fault: Any) -> Response:
        self.sim.log(f"fault {fault.kind} on {fault.pattern} (apply={fault.apply})")
        if fault.kind == "timeout":
            return Response(0, b"", hang=fault.seconds)
        return json_response(500, {"error": {"type": "api_error", "code": None, "decline_code": None, "param": None,
                                             "message": "An unknown error occurred (simulated fault)."}})

    def _execute(self, name: str, args: dict[str, str], params: dict[str, Any], version: str, request_id: str,
                 key: str | None, req: Request) -> Response:
        sim = self.sim
        sim._tls.suppress_flush = True
        # Events caused by a write name its request; a DELETE's Idempotency-Key is shown but not honoured.
        sim._tls.request = ({"id": request_id, "idempotency_key": key or req.header("Idempotency-Key")}
                            if req.method.upper() in ("POST", "DELETE") else None)
        try:
            latency = sim.faults.take(req.method, req.path, kinds=("latency",))
            if latency is not None:
                time.sleep(latency.seconds)
            with sim.lock:
                try:
                    return json_response(200, getattr(self, name)(args, params, version, key))
                except CardDeclined as exc:
                    pi = sim.store.get(exc.payment_intent_id)
                    if pi is not None:
                        exc.extra["payment_intent"] = sim.renderer.render(pi, version)
                    return json_response(exc.status, exc.body())
                except SimError as exc:
                    return json_response(exc.status, exc.body())
        finally:
            sim._tls.suppress_flush = False
            sim._tls.request = None

    # ---- handlers (run under the state lock; return the JSON body)
    def _read(self, object_id: str, kind: str) -> dict[str, Any]:
        if self.sim.faults.take_stale(object_id):
            obj = self.sim.store.previous_version(object_id)
        else:
            obj = self.sim.store.get(object_id, kind)
        if obj is None or obj.get("object") != kind:
            raise not_found(kind, object_id)
        return obj

    def get_invoice(self, args: dict[str, str], params: dict[str, Any], version: str, key: str | None) -> Any:
        return self.sim.renderer.render(self._read(args["id"], "invoice"), version, _expand(params))

    def list_invoices(self, args: dict[str, str], params: dict[str, Any], version: str, key: str | None) -> Any:
        items = [i for i in reversed(self.sim.store.all_of("invoice"))
                 if all(not params.get(f) or i[f] == params[f] for f in ("subscription", "customer", "status"))]
        expand = [e.removeprefix("data.") for e in _expand(params)]
        rendered = [self.sim.renderer.render(i, version, expand) for i in items]
        return _page(rendered, params, "/v1/invoices")

    def invoice_action(self, args: dict[str, str], params: dict[str, Any], version: str, key: str | None) -> Any:
        action, invoice_id = args["action"], args["id"]
        if action == "pay":
            inv = self.sim.pay_invoice(invoice_id, idempotency_key=key,
                                       paid_out_of_band=_flag(params.get("paid_out_of_band", "")))
        else:
            if self.sim.store.get(invoice_id, "invoice") is None:
                raise not_found("invoice", invoice_id, "invoice")
            inv = getattr(self.sim, {"void": "void", "finalize": "finalize",
                                     "mark_uncollectible": "mark_uncollectible"}[action])(invoice_id)
        return self.sim.renderer.render(self.sim.store.get(inv["id"]), version, _expand(params))

    def get_invoice_payment(self, args: dict[str, str], params: dict[str, Any], version: str, key: str | None) -> Any:
        payment = self.sim.renderer.invoice_payment(args["id"])
        if payment is None:
            raise not_found("invoice_payment", args["id"])
        return payment

    def list_invoice_payments(self, args: dict[str, str], params: dict[str, Any], version: str,
                              key: str | None) -> Any:
        wanted = params.get("payment") or {}
        items = []
        for payment_id in reversed(list(self.sim.store.invoice_payment_index)):
            payment = self.sim.renderer.invoice_payment(payment_id)
            if payment is None or (params.get("invoice") and payment["invoice"] != params["invoice"]):
                continue
            if isinstance(wanted, dict) and wanted.get("payment_intent") and \
                    payment["payment"]["payment_intent"] != wanted["payment_intent"]:
                continue
            items.append(payment)
        return _page(items, params, "/v1/invoice_payments")

    def get_object(self, args: dict[str, str], params: dict[str, Any], version: str, key: str | None) -> Any:
        kind = OBJECT_KINDS[args["kind"]]
        return self.sim.renderer.render(self._read(args["id"], kind), version, _expand(params))

    def get_price(self, args: dict[str, str], params: dict[str, Any], version: str, key: str | None) -> Any:
        """``GET /v1/prices/{id}`` (``expand[]=product`` gives the product with its name); a legacy
        plan id is a price here too."""
        price = self.sim.store.prices.get(args["id"])
        if price is None:
            raise not_found("price", args["id"])
        return self.sim.renderer.render(price, version, _expand(params))

    def _subscription(self, sub_id: str, version: str, params: dict[str, Any]) -> Any:
        return self.sim.renderer.render(self.sim.store.get(sub_id), version, _expand(params))

    def cancel_subscription(self, args: dict[str, str], params: dict[str, Any], version: str,
                            key: str | None) -> Any:
        """``DELETE /v1/subscriptions/{id}``: cancel now (``invoice_now``/``prorate`` are accepted and
        make no final invoice). One already canceled answers 404 "No such subscription", as Stripe does."""
        self.sim.cancel_subscription(args["id"])
        return self._subscription(args["id"], version, params)

    def resume_subscription(self, args: dict[str, str], params: dict[str, Any], version: str,
                            key: str | None) -> Any:
        """``POST /v1/subscriptions/{id}/resume``: only a ``status=paused`` subscription resumes here
        (a paused *collection* is resumed by updating ``pause_collection`` to empty)."""
        sub = self.sim._get(args["id"], "subscription")
        if sub["status"] != "paused":
            raise InvalidTransition(f"Only a subscription with status `paused` can be resumed; this one is "
                                    f"`{sub['status']}`.")
        self.sim.resume_subscription(args["id"])
        return self._subscription(args["id"], version, params)

    def update_subscription(self, args: dict[str, str], params: dict[str, Any], version: str,
                            key: str | None) -> Any:
        """``POST /v1/subscriptions/{id}`` with ``cancel_at_period_end``, ``pause_collection[behavior]``
        and ``pause_collection[resumes_at]`` (``pause_collection=`` resumes collection) and
        ``items[0][price]`` (``items[0][id]`` optional: the subscription has one item, which is
        replaced without proration). Everything is checked before anything changes; one request
        emits one ``customer.subscription.updated``."""
        sim = self.sim
        sub = sim._get(args["id"], "subscription")
        changes = [name for name in ("cancel_at_period_end", "pause_collection", "items") if name in params]
        if changes and sub["status"] in ENDED_STATUSES:
            raise InvalidTransition(CANCELED_IS_IMMUTABLE)
        pause: dict[str, Any] | None = None
        if "pause_collection" in params:
            pause = _pause_param(params["pause_collection"])
        price_id = None
        if "items" in params:
            price_id = self._price_param(sub, params["items"])
        previous: dict[str, Any] = {}
        if "cancel_at_period_end" in params:
            previous.update(sim._schedule_cancel(sub, _flag(params["cancel_at_period_end"])))
        if "pause_collection" in params:
            previous.update(sim._set_pause(sub, pause))
        if price_id is not None:
            previous.update(sim._set_price(sub, price_id))
        sim._updated(sub, previous)
        return self._subscription(sub["id"], version, params)

    def _price_param(self, sub: dict[str, Any], items: Any) -> str:
        if not isinstance(items, list) or len(items) != 1 or not isinstance(items[0], dict):
            raise SimError(400, "The simulator's subscriptions have one item: send items[0][price].", param="items")
        item = items[0]
        if item.get("id") and item["id"] != sub["item_id"]:
            raise SimError(400, f"No such subscription item: '{item['id']}'", code="resource_missing",
                           param="items[0][id]")
        price_id = item.get("price") or item.get("plan")
        if not price_id:
            raise SimError(400, "Missing required param: items[0][price].", code="parameter_missing",
                           param="items[0][price]")
        if price_id not in self.sim.store.prices:
            raise SimError(400, f"No such price: '{price_id}'", code="resource_missing", param="items[0][price]")
        return str(price_id)

    def list_events(self, args: dict[str, str], params: dict[str, Any], version: str, key: str | None) -> Any:
        created = params.get("created")
        bounds = created if isinstance(created, dict) else ({"gte": created, "lte": created} if created else {})
        types = params.get("types") or ([params["type"]] if params.get("type") else [])
        checks = {"gt": lambda c, v: c > v, "gte": lambda c, v: c >= v, "lt": lambda c, v: c < v,
                  "lte": lambda c, v: c <= v}
        items = []
        for event in reversed(self.sim.store.events):
            if types and not any(re.fullmatch(re.escape(t).replace(r"\*", ".*"), event["type"]) for t in types):
                continue
            if all(checks[op](event["created"], int(v)) for op, v in bounds.items() if op in checks):
                items.append(json.loads(json.dumps(event)))
        return _page(items, params, "/v1/events")

    def get_event(self, args: dict[str, str], params: dict[str, Any], version: str, key: str | None) -> Any:
        event = self.sim.store.events_by_id.get(args["id"])
        if event is None:
            raise not_found("event", args["id"])
        return json.loads(json.dumps(event))
