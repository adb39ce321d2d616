"""The seeded simulation of the on-chain rail (issue 18): agents paying through the gateway with
x402 on the real test chain while the chain and its JSON-RPC misbehave, and an auditor that
judges the database against the chain itself after every step.

Agents: a fresh key (402 → sign with the SDK client → pay), a replay of a key with its first
signature or none, a second signature on a paid key (must be refused unverified), a signature
already spent presented under a new key (must be rejected), and bursts of one key in threads.
The chain: mining paused and resumed, the node's answer to a broadcast or a receipt query lost
after it acted (a loopback fault proxy), a pending transaction dropped from the pool. Staff and
jobs: the reconcile job, a billing lead paying refunds back. Then a drain: faults cleared,
mining on, reconcile and the leads until nothing is in flight.

What the auditor holds the product to, from the chain's own state (raw SQL and JSON-RPC):
- every payer's token balance moved by exactly the authorizations the token has seen used,
  less the refunds paid back: no payer charged twice, no money moved we do not know about;
- every authorization the token has seen used is one we accepted for exactly one intent (a
  signature we refused never reaches the chain);
- a settlement confirmed only when the token has seen its authorization used;
- no upstream call for an intent whose settlement is not confirmed;
- a paid, undelivered call always has its refund obligation;
- terminal states never change.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.db import connection
from django.test import Client
from eth_account import Account

from agentpay.api.auth import tenant_api_key_create
from agentpay.bridge import trusted_now
from agentpay.chain.token import authorization_state
from agentpay.jobs import agentpay_job_run
from agentpay.models import ChainAuthorization, ChainNetwork, PricedRoute, RefundObligation
from agentpay.services.refunds import refund_pay, refunds_open
from agentpay.services.tenants import tenant_create
from agentpay.states import TERMINAL
from tests.agentpay_x402.buyer import Buyer
from tests.support.rpc_proxy import RpcProxy
from tests.verification.agentpay_sim.auditor import Violation
from tests.verification.agentpay_sim.upstream import SimUpstream

PRICE = 150  # cents
ANSWERS = {"ok": 10, "bad": 3, "boom": 2}  # the upstream's behaviour per route → weight
WEIGHTS = {"pay": 30, "replay": 8, "second_signature": 3, "spent_signature": 3, "burst": 3, "pause_mining": 3,
           "mine": 6, "lose_broadcast_answer": 3, "lose_receipt_answer": 3, "drop_pending": 2, "reconcile": 8,
           "refund": 3}
ONCHAIN_CODES = ("PAYER_BALANCE_MISMATCH", "AUTHORIZATION_PAID_TWO_INTENTS",
                 "CONFIRMED_NOT_ON_CHAIN", "DELIVERED_WITHOUT_CONFIRMED_PAYMENT", "REFUND_NOT_RECORDED",
                 "TERMINAL_STATE_CHANGED", "INTERNAL_ERROR", "SECOND_SIGNATURE_ACCEPTED", "SPENT_SIGNATURE_ACCEPTED",
                 "STUCK_AFTER_DRAIN", "ANSWERED_402_AFTER_AUTHORIZATION")


@dataclass(frozen=True)
class Step:
    kind: str
    a: int = 0
    n: int = 1
    what: str = ""


def generate(seed: int, steps: int) -> list[Step]:
    rng = random.Random(seed)
    out = []
    for _ in range(steps):
        kind = rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))[0]
        out.append(Step(kind, rng.randrange(1 << 30), n=rng.randint(2, 4),
                        what=rng.choices(list(ANSWERS), weights=list(ANSWERS.values()))[0]))
    return out


@dataclass
class Key:
    key: str
    route: str
    buyer: Buyer
    signature: str = ""
    authorized: bool = False  # the gateway took an authorization for it


@dataclass
class Result:
    seed: int
    steps: int
    violations: list[Violation]
    counters: Counter = field(default_factory=Counter)

    @property
    def ok(self) -> bool:
        return not self.violations


# The settlement's confirmation and the dispatch, in receipt order, per on-chain intent.
DISPATCH_ORDER = """
    SELECT i.intent_id,
           MIN(r.id) FILTER (WHERE r.line = 'fulfillment' AND r.event = 'dispatch' AND r.accepted),
           MIN(r.id) FILTER (WHERE r.line = 'settlement' AND r.accepted AND r.to_state = 'confirmed')
    FROM agentpay_paymentintent i JOIN agentpay_intentreceipt r ON r.intent_id = i.id
    WHERE i.rail = 'onchain' GROUP BY i.intent_id"""
TWICE = """SELECT payer, nonce, COUNT(*) FROM agentpay_chainauthorization GROUP BY network_id, token_address, payer,
           nonce HAVING COUNT(*) > 1"""
LINES = """
    SELECT i.intent_id, i.state, (SELECT s.state FROM agentpay_settlement s WHERE s.intent_id = i.id
                                  ORDER BY s.id DESC LIMIT 1), f.state
    FROM agentpay_paymentintent i JOIN agentpay_fulfillment f ON f.intent_id = i.id WHERE i.rail = 'onchain'"""


def _rows(sql: str) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchall()


class OnchainSimulation:
    def __init__(self, seed: int, steps: list[Step], *, chain: Any) -> None:
        self.seed, self.steps, self.chain = seed, steps, chain
        self.upstream = SimUpstream()
        self.proxy = RpcProxy(chain.rpc_url)
        self.keys: list[Key] = []
        self.spent: list[str] = []  # signatures the gateway took, for the spent-signature agents
        self.counters: Counter = Counter()
        self.violations: list[Violation] = []
        self._seen: set[tuple[str, str]] = set()
        self.snapshots: dict[str, tuple] = {}
        self.step_no = -1
        self._lock = threading.Lock()
        self.rng = random.Random(seed)

    # -- world --
    def _setup(self) -> None:
        group, _ = Group.objects.get_or_create(name="Billing leads")
        group.permissions.add(*Permission.objects.filter(content_type__app_label="agentpay",
                                                         codename__in=["resolve_review", "credit_wallet"]))
        lead = get_user_model().objects.create_user(f"sim-chain-lead-{self.seed}", is_staff=True)
        lead.groups.add(group)
        self.lead = get_user_model().objects.get(pk=lead.pk)
        self.network = self.chain.make_network(rpc_url=self.proxy.url, rpc_timeout_seconds=1.0)
        for what in ANSWERS:
            PricedRoute.objects.create(
                slug=f"chain-{what}", name=what, upstream_base_url=self.upstream.base_url, upstream_path=f"/{what}",
                method="POST", price_minor=PRICE, currency="usd", rails_allowed=["onchain"], network=self.network,
                connect_timeout_seconds=1.0, read_timeout_seconds=1.0,
                status_query_url=f"{self.upstream.base_url}/status")
        self.tenant = tenant_create(name=f"sim chain tenant {self.seed}")
        self.api_key = tenant_api_key_create(tenant=self.tenant, label="sim")[1]
        self.payers = {p.address: p for p in self.chain.payers}
        self.start_balances = {a: self.chain.balance(a) for a in self.payers}

    def run(self) -> Result:
        self.upstream.start()
        self.proxy.start()
        try:
            self._setup()
            for number, step in enumerate(self.steps):
                self.step_no = number
                self.counters[step.kind] += 1
                getattr(self, f"do_{step.kind}")(step)
                self.check()
            self.step_no = len(self.steps)
            self.drain()
        finally:
            self.chain.set_automine(True)
            self.proxy.stop()
            self.upstream.stop()
        return Result(self.seed, len(self.steps), self.violations, self.counters)

    def flag(self, code: str, detail: str) -> None:
        if (code, detail) not in self._seen:
            self._seen.add((code, detail))
            self.violations.append(Violation(code, self.step_no, self.seed, detail))

    # -- agents --
    def _post(self, key: Key, signature: str | None) -> Any:
        headers = {"HTTP_IDEMPOTENCY_KEY": key.key, "HTTP_AUTHORIZATION": f"Bearer {self.api_key}"}
        if signature:
            headers["HTTP_PAYMENT_SIGNATURE"] = signature
        response = Client().post(f"/agentpay/v1/routes/{key.route}/run", data=b'{"q": 1}',
                                 content_type="application/json", **headers)
        with self._lock:
            self.counters[f"http:{response.status_code}"] += 1
        if response.status_code >= 500 and response.status_code not in (502, 503, 504):
            self.flag("INTERNAL_ERROR", f"{key.key}: {response.status_code} {response.content[:200]!r}")
        if key.authorized and response.status_code == 402 and response.has_header("PAYMENT-REQUIRED"):
            self.flag("ANSWERED_402_AFTER_AUTHORIZATION", f"{key.key}: a new payment asked for a paid key")
        return response

    def _pay(self, key: Key) -> Any:
        required = self._post(key, None)
        if required.status_code != 402 or not required.has_header("PAYMENT-REQUIRED"):
            return required
        key.signature = key.buyer.pay(required["PAYMENT-REQUIRED"])
        response = self._post(key, key.signature)
        if response.status_code in (200, 202, 400, 502, 504) or response.has_header("PAYMENT-RESPONSE"):
            key.authorized = ChainAuthorization.objects.filter(intent__idempotency_key=key.key).exists()
            if key.authorized:
                self.spent.append(key.signature)
        return response

    def _new_key(self, step: Step) -> Key:
        payer = list(self.payers.values())[step.a % len(self.payers)]
        key = Key(f"c{self.seed}-k{len(self.keys)}", f"chain-{step.what}", Buyer(Account.from_key(payer.key)))
        self.keys.append(key)
        return key

    def do_pay(self, step: Step) -> None:
        self._pay(self._new_key(step))

    def do_replay(self, step: Step) -> None:
        if self.keys:
            key = self.keys[step.a % len(self.keys)]
            self._post(key, key.signature if step.n % 2 else None)

    def do_second_signature(self, step: Step) -> None:
        paid = [k for k in self.keys if k.authorized]
        if paid:
            key = paid[step.a % len(paid)]
            required = self._post(Key(key.key + "-probe", key.route, key.buyer), None)
            if required.has_header("PAYMENT-REQUIRED"):
                answer = self._post(key, key.buyer.pay(required["PAYMENT-REQUIRED"]))
                if answer.status_code != 422:
                    self.flag("SECOND_SIGNATURE_ACCEPTED", f"{key.key}: {answer.status_code}")

    def do_spent_signature(self, step: Step) -> None:
        if self.spent:
            key = self._new_key(step)
            self._post(key, None)
            answer = self._post(key, self.spent[step.a % len(self.spent)])
            if answer.status_code not in (400, 402, 422):
                self.flag("SPENT_SIGNATURE_ACCEPTED", f"{key.key}: {answer.status_code} {answer.content[:200]!r}")

    def do_burst(self, step: Step) -> None:
        key = self._new_key(step)
        required = self._post(key, None)
        if not required.has_header("PAYMENT-REQUIRED"):
            return
        key.signature = key.buyer.pay(required["PAYMENT-REQUIRED"])

        def send() -> None:
            try:
                self._post(key, key.signature)
            except Exception as exc:  # noqa: BLE001 — a thread's error is a finding
                self.flag("INTERNAL_ERROR", f"burst {key.key}: {type(exc).__name__}: {exc}")
            finally:
                connection.close()

        threads = [threading.Thread(target=send) for _ in range(step.n)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        key.authorized = ChainAuthorization.objects.filter(intent__idempotency_key=key.key).exists()

    # -- the chain --
    def do_pause_mining(self, step: Step) -> None:
        self.chain.set_automine(False)

    def do_mine(self, step: Step) -> None:
        self.chain.mine(step.n)
        self.chain.set_automine(True)

    def do_lose_broadcast_answer(self, step: Step) -> None:
        self.proxy.drop("eth_sendRawTransaction", after_forward=True, times=1)

    def do_lose_receipt_answer(self, step: Step) -> None:
        self.proxy.drop("eth_getTransactionReceipt", after_forward=True, times=step.n)

    def do_drop_pending(self, step: Step) -> None:
        if self.chain.kind != "anvil":
            return
        pending = self.chain.pending_transactions()
        if pending:
            self.chain.drop_transaction(pending[step.a % len(pending)])
            self.counters["dropped"] += 1

    # -- jobs and staff --
    def do_reconcile(self, step: Step) -> None:
        run = agentpay_job_run("agentpay_onchain_reconcile", now=trusted_now())
        self.counters["reconcile_changed"] += run.changed

    def do_refund(self, step: Step) -> None:
        for refund in refunds_open()[:1]:
            if refund.state == "not_started":
                refund_pay(refund.refund_id, user=self.lead, reason="paid, not delivered",
                           ticket=f"SIMC-{self.step_no}")
                self.counters["refunds_paid"] += 1

    def drain(self) -> None:
        self.proxy.clear()
        self.chain.set_automine(True)
        self.chain.mine(2)
        for _ in range(6):
            for key in self.keys:
                if key.authorized:
                    self._post(key, None)
            for job in ("agentpay_onchain_reconcile", "agentpay_fulfillment_status_query"):
                agentpay_job_run(job, now=trusted_now())
            for refund in refunds_open():
                if refund.state == "not_started":
                    refund_pay(refund.refund_id, user=self.lead, reason="drain", ticket="SIMC-END")
            self.chain.mine(2)
            self.check()
        live = [row for row in _rows(LINES) if row[2] in ("submitted", "pending", "unknown")
                or row[3] == "in_progress"]
        if live:
            self.flag("STUCK_AFTER_DRAIN", f"{len(live)} on-chain intents still in flight: {live[:5]}")
        for _, state, s, f in _rows(LINES):
            self.counters[f"end:{state}/{s}/{f}"] += 1
        self.counters["refunds_confirmed"] = RefundObligation.objects.filter(state="confirmed").count()

    # -- the auditor --
    def check(self) -> None:
        network = ChainNetwork.objects.get(pk=self.network.pk)
        direct = ChainNetwork(**{f.attname: getattr(network, f.attname) for f in ChainNetwork._meta.concrete_fields})
        direct.rpc_url = self.chain.rpc_url  # the auditor reads the node itself, not through the faults
        used_value: Counter = Counter()
        for auth in ChainAuthorization.objects.all():
            if authorization_state(direct, auth.payer, auth.nonce):
                used_value[auth.payer] += int(auth.value)
        refunded: Counter = Counter()  # refunds the chain has executed, whatever our record says yet
        for refund in RefundObligation.objects.exclude(chain_tx=None).select_related("chain_tx"):
            receipt = self.chain.rpc("eth_getTransactionReceipt", [refund.chain_tx.tx_hash])
            if receipt and int(receipt["status"], 16) == 1:
                refunded[refund.payer] += int(refund.amount)
        for address in self.payers:
            moved = self.start_balances[address] - self.chain.balance(address)
            expected = used_value[address] - refunded[address]
            if moved != expected:
                self.flag("PAYER_BALANCE_MISMATCH", f"{address}: balance moved {moved}, authorizations used "
                                                    f"{used_value[address]} less refunds {refunded[address]}")
        for payer, nonce, count in _rows(TWICE):
            self.flag("AUTHORIZATION_PAID_TWO_INTENTS", f"{payer} nonce {nonce}: {count} intents")
        for intent_id, dispatched, confirmed in _rows(DISPATCH_ORDER):
            if dispatched is not None and (confirmed is None or confirmed > dispatched):
                self.flag("DELIVERED_WITHOUT_CONFIRMED_PAYMENT", f"{intent_id}: dispatched before its settlement "
                                                                 f"was confirmed")
        for intent_id, state, s, f in _rows(LINES):
            if s == "confirmed":
                auth = ChainAuthorization.objects.filter(intent__intent_id=intent_id).first()
                if auth is None or not authorization_state(direct, auth.payer, auth.nonce):
                    self.flag("CONFIRMED_NOT_ON_CHAIN", f"{intent_id}: confirmed, the token has not seen its "
                                                        f"authorization used")
                if f == "failed" and not RefundObligation.objects.filter(intent__intent_id=intent_id).exists():
                    self.flag("REFUND_NOT_RECORDED", f"{intent_id}: paid, not delivered, no refund obligation")
            before = self.snapshots.get(intent_id)
            now = (state, s, f)
            if before is not None and before != now and (
                    before[0] in TERMINAL["intent"]
                    or any(b != n and b in TERMINAL[line] for line, b, n in zip(("intent", "settlement",
                                                                                "fulfillment"), before, now,
                                                                               strict=True))):
                self.flag("TERMINAL_STATE_CHANGED", f"{intent_id}: {before} → {now}")
            self.snapshots[intent_id] = now
