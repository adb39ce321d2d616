"""Invariants of the Alipay simulation, after every step and once more after the final settle.
The simulator is the monetary truth; the product's tables are what it believed.

The deductions and queries the product sends are shown to the auditor as they happen (the
engine wraps ``AlipayGateway.trade_pay`` / ``trade_query``), so "a deduction with an unknown outcome
is never followed by another deduction for the same order until a query resolved it" is judged on
the wire, not on what the product wrote down about it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from dunning.acceptance import settlement
from dunning.acceptance.aggregate import EMPTY_ROOT
from dunning.acceptance.aggregate import aggregate_decision as _pure_decision
from dunning.acceptance.aggregate import outstanding_root as _pure_root
from dunning.acceptance.contract import ContractView
from dunning.acceptance.contract import contract_ceiling as _pure_ceiling
from dunning.acceptance.contract import contract_phase as _pure_phase
from dunning.models import DunningCycle, MonetaryFact
from dunning.policy.cache import policy_spec
from entitlements.profiles import FULL
from subscriptions.models import AlipayRenewalOrder, AlipayTrade, Subscription

PAID = {"TRADE_SUCCESS", "TRADE_FINISHED"}
TERMINAL = {"CANCELED", "CLOSED_VOID"}
# A paid order's cycle may also have ended another way first (canceled after restriction, voided,
# or held for a person as an evidence conflict): the money is still recorded as a fact.
SETTLED_AFTER_PAID = {"RECOVERED", "EVIDENCE_CONFLICT", "CANCELED", "CLOSED_VOID"}
TRANSIENT_SUB_CODES = {"ACQ.SYSTEM_ERROR", "ACQ.TRADE_STATUS_ERROR", "aop.ACQ.SYSTEM_ERROR"}
DECIDED_QUERY = PAID | {"TRADE_CLOSED"}

CODES = (
    "DUPLICATE_CHARGE", "UNPERSISTED_DISPATCH", "BLIND_RETRY", "PAID_ORDER_CHARGED_AGAIN", "TOO_MANY_DEDUCTIONS",
    "RECOVERED_WITHOUT_MONEY", "FABRICATED_PAYMENT", "MONEY_NOT_RECORDED", "PAID_NOT_RECOVERED",
    "UNKNOWN_LEFT_AFTER_SETTLE", "ACCESS_NOT_AS_ALLOWED", "FULL_WHILE_BLOCKING", "TERMINAL_STATE_CHANGED",
    "ENTITLEMENT_GENERATION_REGRESSED", "REFUSED_NOTIFICATION_CHANGED_ACCESS", "FORGED_NOTIFICATION_ACCEPTED",
    "RENEWED_AFTER_REVOCATION", "JOB_CRASHED",
)


@dataclass(frozen=True)
class Violation:
    code: str
    step: int
    step_repr: str
    detail: str

    def __str__(self) -> str:
        return f"[step {self.step} {self.step_repr}] {self.code}: {self.detail}"


def order_of(out_trade_no: str) -> str:
    """The product names a deduction `<order_no>T<hash>`; the auditor reads the order from the name
    too, so a charge the product has no row for is still attributed."""
    return out_trade_no.rpartition("T")[0] or out_trade_no


class Auditor:
    def __init__(self, run: Any) -> None:
        self.run = run
        self.pending: list[Violation] = []
        self.unknown: set[str] = set()  # deductions whose last answer said nothing definite
        self.sent: dict[str, set[str]] = defaultdict(set)  # order_no -> out_trade_nos sent
        self.terminal: dict[int, str] = {}
        self.generations: dict[int, int] = {}
        self.orders_at_revocation: dict[str, set[str]] = {}  # agreement_no -> orders then
        self.seen: set[tuple[str, str]] = set()

    # ---- reporting
    def report(self, code: str, detail: str) -> None:
        if (code, detail) in self.seen:
            return
        self.seen.add((code, detail))
        step = getattr(self.run, "step_index", -1)
        steps = self.run.schedule.steps
        where = str(steps[step]) if 0 <= step < len(steps) else "setup/settle"
        self.pending.append(Violation(code, step, where, detail))

    def take(self) -> list[Violation]:
        taken, self.pending = self.pending, []
        return taken

    # ---- on the wire
    def on_pay(self, out_trade_no: str, amount_fen: int) -> None:
        trade = AlipayTrade.objects.select_related("order__agreement").filter(out_trade_no=out_trade_no).first()
        if trade is None:
            self.report("UNPERSISTED_DISPATCH", f"alipay.trade.pay {out_trade_no} sent with no AlipayTrade row")
            return
        order = trade.order.order_no
        blind = sorted(o for o in self.unknown if order_of(o) == order and o != out_trade_no)
        if blind:
            self.report("BLIND_RETRY", f"{out_trade_no} sent for {order} while {', '.join(blind)} had no "
                                       f"definite answer and no query had resolved it")
        paid = [t["out_trade_no"] for t in self.run.sim.trade_list()
                if order_of(t["out_trade_no"]) == order and t["trade_status"] in PAID and
                t["out_trade_no"] != out_trade_no]
        if paid:
            self.report("PAID_ORDER_CHARGED_AGAIN", f"{out_trade_no} sent for {order}, already paid by {paid}")
        self.sent[order].add(out_trade_no)
        sub = Subscription.objects.filter(provider="alipay",
                                          provider_subscription_id=trade.order.agreement.agreement_no).first()
        limit = policy_spec(sub.policy).max_attempts if sub and sub.policy_id else 3
        if len(self.sent[order]) > limit:
            self.report("TOO_MANY_DEDUCTIONS", f"{order}: {len(self.sent[order])} deductions sent, policy allows "
                                               f"{limit}: {sorted(self.sent[order])}")

    def on_answer(self, kind: str, out_trade_no: str, answer: Any) -> None:
        if kind == "pay":
            definite = answer is not None and (
                answer.code == "10000" or (answer.code == "40004" and answer.sub_code not in TRANSIENT_SUB_CODES))
        else:
            # A query is definite when Alipay says the trade is decided, or that it has none (a
            # timed-out pay takes effect before its connection is dropped, so nothing is in flight).
            definite = answer is not None and (
                (answer.code == "10000" and answer.body.get("trade_status") in DECIDED_QUERY)
                or (answer.code == "40004" and answer.sub_code == "ACQ.TRADE_NOT_EXIST"))
            if not definite:
                return  # an unanswered query leaves the deduction as it was
        if definite:
            self.unknown.discard(out_trade_no)
        else:
            self.unknown.add(out_trade_no)

    # ---- access around one notification
    def access(self) -> dict[int, tuple[str, int]]:
        return {pk: (profile, generation) for pk, profile, generation in Subscription.objects.filter(
            provider="alipay").values_list("pk", "entitlement_profile", "entitlement_generation")}

    def unchanged_access(self, before: dict[int, tuple[str, int]], why: str) -> None:
        after = self.access()
        changed = {pk: (before.get(pk), now) for pk, now in after.items() if before.get(pk) != now}
        if changed:
            self.report("REFUSED_NOTIFICATION_CHANGED_ACCESS", f"{why}, yet access changed: {changed}")

    # ---- after each step
    def check(self, *, step_index: int, step: Any, final: bool = False) -> None:
        sim_trades = self.run.sim.trade_list()
        ours = {t.out_trade_no: t for t in AlipayTrade.objects.select_related("order")}
        paid_by_order: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for trade in sim_trades:
            if trade["out_trade_no"] not in ours:
                self.report("UNPERSISTED_DISPATCH", f"Alipay holds {trade['out_trade_no']} "
                                                    f"({trade['trade_status']}), which we never recorded")
            if trade["trade_status"] in PAID:
                paid_by_order[order_of(trade["out_trade_no"])].append(trade)
        for order, paid in paid_by_order.items():
            if len(paid) > 1:
                self.report("DUPLICATE_CHARGE", f"order {order} paid {len(paid)} times: "
                                                f"{[t['out_trade_no'] for t in paid]}")
        paid_trades = {t["out_trade_no"]: t for ts in paid_by_order.values() for t in ts}
        cycles = list(DunningCycle.objects.filter(invoice__provider="alipay").select_related("invoice"))
        for cycle in cycles:
            order = cycle.invoice.provider_invoice_id
            if cycle.state == "RECOVERED" and order not in paid_by_order:
                self.report("RECOVERED_WITHOUT_MONEY", f"cycle of {order} RECOVERED; Alipay holds no paid "
                                                       f"trade for it")
            held = self.terminal.get(cycle.pk)
            if held is not None and cycle.state != held:
                self.report("TERMINAL_STATE_CHANGED", f"cycle of {order} left {held} for {cycle.state}")
            if cycle.state in TERMINAL:
                self.terminal.setdefault(cycle.pk, cycle.state)
        facts = list(MonetaryFact.objects.filter(kind="PAYMENT_SUCCEEDED", invoice__provider="alipay")
                     .select_related("invoice"))
        for fact in facts:
            trade = paid_trades.get(fact.provider_ref)
            if trade is None or order_of(fact.provider_ref) != fact.invoice.provider_invoice_id:
                self.report("FABRICATED_PAYMENT", f"payment fact {fact.dedupe_key} for "
                                                  f"{fact.invoice.provider_invoice_id} names {fact.provider_ref!r}, "
                                                  f"not a paid trade of that order in Alipay")
            elif fact.amount != trade["amount_fen"]:
                self.report("FABRICATED_PAYMENT", f"payment fact {fact.dedupe_key}: {fact.amount} fen, Alipay "
                                                  f"collected {trade['amount_fen']}")
        subs = list(Subscription.objects.filter(provider="alipay").select_related("policy"))
        self._subscriptions(subs, final)
        self._revocations(subs)
        if final:
            self._final(paid_trades, cycles, facts, ours)

    def _subscriptions(self, subs: list[Any], final: bool) -> None:
        now = self.run.now()
        for sub in subs:
            key = sub.provider_subscription_id
            if sub.entitlement_generation < self.generations.get(sub.pk, 0):
                self.report("ENTITLEMENT_GENERATION_REGRESSED", f"{key}: generation {sub.entitlement_generation} "
                                                                f"after {self.generations[sub.pk]}")
            self.generations[sub.pk] = max(sub.entitlement_generation, self.generations.get(sub.pk, 0))
            spec = policy_spec(sub.policy)
            views = settlement.subscription_views(sub, None)
            decision = _pure_decision(views, recover_with_remaining_debt=spec.recover_with_remaining_debt)
            if sub.entitlement_profile == FULL and decision.profile != FULL:
                self.report("FULL_WHILE_BLOCKING", f"{key}: FULL while its cycles decide {decision.profile}")
            if final and _pure_root(views) == EMPTY_ROOT:
                # Nothing owed after the settle: access is exactly what the contract allows now
                # (FULL while the agreement's contract is live; an ended one allows less).
                allowed = _pure_ceiling(_pure_phase(ContractView.of(sub), now), spec)
                if sub.entitlement_profile != allowed:
                    self.report("ACCESS_NOT_AS_ALLOWED", f"{key}: nothing owed, access {sub.entitlement_profile}, "
                                                         f"the contract allows {allowed}")

    def _revocations(self, subs: list[Any]) -> None:
        """Once the product applied a customer's revocation (the subscription ends at its period
        end), no renewal order is opened for it again. Accepted set: orders that exist at the end of
        the step in which the revocation was first seen applied (opened before it arrived)."""
        for sub in subs:
            if not sub.cancel_at_period_end:
                continue
            agreement_no = sub.provider_subscription_id
            orders = set(AlipayRenewalOrder.objects.filter(agreement__agreement_no=agreement_no)
                         .values_list("order_no", flat=True))
            known = self.orders_at_revocation.setdefault(agreement_no, orders)
            for order in sorted(orders - known):
                self.report("RENEWED_AFTER_REVOCATION", f"{agreement_no}: renewal order {order} opened after the "
                                                        f"revocation was applied")

    def _final(self, paid_trades: dict[str, dict[str, Any]], cycles: list[Any], facts: list[Any],
               ours: dict[str, Any]) -> None:
        recorded = {f.provider_ref for f in facts}
        state_of = {c.invoice.provider_invoice_id: c.state for c in cycles}
        for out_trade_no, trade in paid_trades.items():
            if out_trade_no not in recorded:
                self.report("MONEY_NOT_RECORDED", f"Alipay collected {trade['amount_fen']} fen by {out_trade_no}; "
                                                  f"no payment fact after the settle")
            state = state_of.get(order_of(out_trade_no))
            if state not in SETTLED_AFTER_PAID:
                self.report("PAID_NOT_RECOVERED", f"{order_of(out_trade_no)} paid by {out_trade_no}; its cycle is "
                                                  f"{state} after the settle")
        left = sorted(o for o, t in ours.items() if t.status in ("SENT", "WAIT_BUYER_PAY"))
        if left:
            self.report("UNKNOWN_LEFT_AFTER_SETTLE", f"deductions still without an outcome: {left}")
