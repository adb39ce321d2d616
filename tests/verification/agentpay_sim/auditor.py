"""The AgentPay invariants, checked against the database after every simulation step.

Money (wallet-ledger-spec §3): debits = credits per currency, each account's totals equal its
transfers, no wallet below zero available, no hold resolved twice. The rails (seed 004 §1, §3.2):
no capture without an upstream 2xx (or a status query that said succeeded, or a billing lead's
"delivered"), no release without proof of non-execution and never while the fulfillment is
unknown, terminal states never change, one intent per (tenant, key), one upstream call per
fulfillment. Evidence is judged against what the loopback upstream itself logged, not only
against the receipts the product wrote. Raw SQL throughout: the auditor does not trust the models.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.db import connection

from agentpay.states import TERMINAL
from tests.verification.agentpay_sim.upstream import SimUpstream

CODES = (
    "LEDGER_UNBALANCED", "ACCOUNT_TOTALS_MISMATCH", "NEGATIVE_AVAILABLE", "HOLD_RESOLVED_TWICE",
    "CAPTURE_WITHOUT_2XX", "CAPTURE_NOT_DELIVERED", "RELEASE_WITHOUT_EVIDENCE", "RELEASE_WHILE_UNKNOWN",
    "RELEASE_OF_DELIVERED", "TERMINAL_STATE_CHANGED", "DUPLICATE_INTENT_FOR_KEY", "KEY_ANSWERED_TWO_INTENTS",
    "UPSTREAM_CALLED_TWICE", "INTERNAL_ERROR", "KEY_REUSE_ACCEPTED", "FUTURE_NOW_CHANGED_STATE", "STUCK_AFTER_DRAIN",
    "RELEASE_OF_DISPATCHED", "HOLD_PENDING_PAST_DEADLINES",
)


@dataclass(frozen=True)
class Violation:
    code: str
    step: int
    seed: int
    detail: str

    def __str__(self) -> str:
        return f"[seed {self.seed} step {self.step}] {self.code}: {self.detail}"


def _rows(sql: str, params: tuple = ()) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


BALANCE = """
    SELECT currency, SUM(debits_posted) - SUM(credits_posted), SUM(debits_pending) - SUM(credits_pending)
    FROM agentpay_ledgeraccount GROUP BY currency
    HAVING SUM(debits_posted) <> SUM(credits_posted) OR SUM(debits_pending) <> SUM(credits_pending)"""
# Each account's four totals recomputed from the append-only transfers.
TOTALS = """
    WITH open_hold AS (
        SELECT h.* FROM agentpay_transfer h WHERE h.kind = 'pending'
        AND NOT EXISTS (SELECT 1 FROM agentpay_transfer r WHERE r.pending_id = h.id)),
    moves AS (
        SELECT debit_account_id AS acc, amount AS dp, 0 AS cp, 0 AS dpe, 0 AS cpe FROM agentpay_transfer
            WHERE kind IN ('posted', 'post_pending')
        UNION ALL SELECT credit_account_id, 0, amount, 0, 0 FROM agentpay_transfer
            WHERE kind IN ('posted', 'post_pending')
        UNION ALL SELECT debit_account_id, 0, 0, amount, 0 FROM open_hold
        UNION ALL SELECT credit_account_id, 0, 0, 0, amount FROM open_hold),
    sums AS (SELECT acc, SUM(dp) dp, SUM(cp) cp, SUM(dpe) dpe, SUM(cpe) cpe FROM moves GROUP BY acc)
    SELECT a.account_id, a.kind, a.debits_posted, a.credits_posted, a.debits_pending, a.credits_pending,
           COALESCE(s.dp, 0), COALESCE(s.cp, 0), COALESCE(s.dpe, 0), COALESCE(s.cpe, 0)
    FROM agentpay_ledgeraccount a LEFT JOIN sums s ON s.acc = a.id"""
TWICE = """SELECT h.transfer_id, COUNT(*) FROM agentpay_transfer r JOIN agentpay_transfer h ON h.id = r.pending_id
           GROUP BY h.transfer_id HAVING COUNT(*) > 1"""
# Hold resolutions not yet judged: (transfer pk, kind, intent id, fulfillment id, fulfillment state).
RESOLUTIONS = """
    SELECT r.id, r.kind, i.intent_id, f.fulfillment_id, f.state, i.id, f.dispatched_at FROM agentpay_transfer r
    JOIN agentpay_paymentintent i ON i.id = r.intent_id JOIN agentpay_fulfillment f ON f.intent_id = i.id
    WHERE r.kind IN ('post_pending', 'void_pending') AND r.id > %s ORDER BY r.id"""
EVIDENCE = """SELECT event, data, actor_user_id, reason, ticket FROM agentpay_intentreceipt
              WHERE intent_id = %s AND accepted AND line = 'fulfillment'"""
# Every intent's three lines (its latest settlement) and generation.
LINES = """
    SELECT i.intent_id, i.state, (SELECT s.state FROM agentpay_settlement s WHERE s.intent_id = i.id
                                  ORDER BY s.id DESC LIMIT 1), f.state, i.generation
    FROM agentpay_paymentintent i JOIN agentpay_fulfillment f ON f.intent_id = i.id"""
DUPLICATE_KEYS = """SELECT tenant_id, idempotency_key, COUNT(*) FROM agentpay_paymentintent
                    GROUP BY tenant_id, idempotency_key HAVING COUNT(*) > 1"""
# Settled while the fulfillment has no outcome: a resolution transfer, or a settled state. The one
# exception, judged in `_resolutions`: a never-dispatched hold released by hold_expired.
SETTLED_UNKNOWN = """
    SELECT i.intent_id, s.state, f.state FROM agentpay_paymentintent i JOIN agentpay_fulfillment f ON f.intent_id = i.id
    JOIN agentpay_settlement s ON s.intent_id = i.id
    WHERE f.state IN ('unknown', 'in_progress', 'not_started') AND (s.state IN ('confirmed', 'released')
          OR EXISTS (SELECT 1 FROM agentpay_transfer r WHERE r.intent_id = i.id AND r.pending_id IS NOT NULL))
      AND NOT (f.state = 'not_started' AND f.dispatched_at IS NULL AND s.state = 'released'
               AND NOT EXISTS (SELECT 1 FROM agentpay_transfer r WHERE r.intent_id = i.id
                               AND r.kind = 'post_pending'))"""
EXPIRED_BY = """SELECT 1 FROM agentpay_intentreceipt WHERE intent_id = %s AND accepted AND line = 'settlement'
                AND event = 'hold_expired'"""
# Holds neither captured nor released, with their intent and fulfillment.
OPEN_HOLDS = """
    SELECT h.transfer_id, i.intent_id, i.state, f.state FROM agentpay_transfer h
    JOIN agentpay_paymentintent i ON i.id = h.intent_id JOIN agentpay_fulfillment f ON f.intent_id = i.id
    WHERE h.kind = 'pending' AND NOT EXISTS (SELECT 1 FROM agentpay_transfer r WHERE r.pending_id = h.id)
    ORDER BY h.id"""


class Auditor:
    def __init__(self, *, seed: int, upstream: SimUpstream, decisions: dict[str, bool]) -> None:
        self.seed, self.upstream, self.decisions = seed, upstream, decisions
        self.snapshots: dict[str, tuple[str, str, str, int]] = {}
        self.last_resolution = 0
        self.violations: list[Violation] = []
        self._seen: set[tuple[str, str]] = set()

    def flag(self, code: str, step: int, detail: str) -> None:
        key = (code, detail)
        if key not in self._seen:  # a standing violation is reported at the step it appeared
            self._seen.add(key)
            self.violations.append(Violation(code, step, self.seed, detail))

    def check(self, step: int) -> None:
        for currency, posted, pending in _rows(BALANCE):
            self.flag("LEDGER_UNBALANCED", step, f"{currency}: debits − credits = {posted} posted, {pending} pending")
        for account, kind, *stored_and_recomputed in _rows(TOTALS):
            stored, recomputed = tuple(stored_and_recomputed[:4]), tuple(stored_and_recomputed[4:])
            if stored != recomputed:
                self.flag("ACCOUNT_TOTALS_MISMATCH", step, f"{account}: totals {stored}, transfers say {recomputed}")
            for label, (cp, dp, dpe) in (("stored", (stored[1], stored[0], stored[2])),
                                         ("from transfers", (recomputed[1], recomputed[0], recomputed[2]))):
                if kind == "wallet" and cp - dp - dpe < 0:
                    self.flag("NEGATIVE_AVAILABLE", step, f"{account} available {cp - dp - dpe} ({label})")
        for hold, count in _rows(TWICE):
            self.flag("HOLD_RESOLVED_TWICE", step, f"{hold} resolved {count} times")
        self._resolutions(step)
        for intent_id, s, f in _rows(SETTLED_UNKNOWN):
            code = "RELEASE_WHILE_UNKNOWN" if s != "confirmed" else "CAPTURE_WITHOUT_2XX"
            self.flag(code, step, f"{intent_id}: settlement {s} while the fulfillment is {f}")
        self._terminal(step)
        for tenant, key, count in _rows(DUPLICATE_KEYS):
            self.flag("DUPLICATE_INTENT_FOR_KEY", step, f"tenant {tenant} key {key!r}: {count} intents")
        with self.upstream.lock:
            twice = [(ful, n) for ful, n in self.upstream.calls.items() if n > 1]
        for ful, n in twice:
            self.flag("UPSTREAM_CALLED_TWICE", step, f"{ful} sent {n} times")

    def _resolutions(self, step: int) -> None:
        up = self.upstream
        for pk, kind, intent_id, ful, f_state, intent_pk, dispatched_at in _rows(RESOLUTIONS, (self.last_resolution,)):
            self.last_resolution = pk
            evidence = _rows(EVIDENCE, (intent_pk,))
            with up.lock:
                served, said, acted = up.served.get(ful), up.status_served.get(ful, set()), up.acted.get(ful)
                called = up.calls.get(ful, 0)
            if kind == "void_pending" and f_state == "not_started":
                # A hold that expired undispatched: only if no call was ever made, by our record
                # and by the upstream's own log.
                if dispatched_at is not None or called or acted is not None:
                    self.flag("RELEASE_OF_DISPATCHED", step, f"{intent_id} released undispatched; dispatched at "
                                                             f"{dispatched_at}, upstream called {called} times")
                elif not _rows(EXPIRED_BY, (intent_pk,)):
                    self.flag("RELEASE_WITHOUT_EVIDENCE", step, f"{intent_id} released before any dispatch, not "
                                                                f"by hold_expired")
                continue
            if kind == "post_pending":
                if f_state != "succeeded" or not any(self._proves(e, True, served, said, intent_id) for e in evidence):
                    self.flag("CAPTURE_WITHOUT_2XX", step, f"{intent_id} captured; fulfillment {f_state}, evidence "
                                                           f"{[e[0] for e in evidence]}, upstream served {served}")
                if acted != "succeeded":
                    self.flag("CAPTURE_NOT_DELIVERED", step, f"{intent_id} captured; the upstream says {acted}")
            else:
                if f_state != "failed":
                    self.flag("RELEASE_WHILE_UNKNOWN", step, f"{intent_id} released; fulfillment {f_state}")
                elif not any(self._proves(e, False, served, said, intent_id) for e in evidence):
                    self.flag("RELEASE_WITHOUT_EVIDENCE", step, f"{intent_id} released; evidence "
                                                                f"{[e[0] for e in evidence]}, upstream served {served}")
                if acted in ("succeeded", "in_progress"):
                    self.flag("RELEASE_OF_DELIVERED", step, f"{intent_id} released; the upstream says {acted}")

    def check_after_deadlines(self, step: int) -> None:
        """After the clock passed every TTL and deadline and the jobs and leads ran: a hold still
        pending is money kept for ever (a job that should have ended it did not)."""
        self.check(step)
        for hold, intent_id, state, f_state in _rows(OPEN_HOLDS):
            self.flag("HOLD_PENDING_PAST_DEADLINES", step, f"{hold} of {intent_id} still pending (intent {state}, "
                                                           f"fulfillment {f_state})")

    def _proves(self, receipt: tuple, delivered: bool, served: tuple[int, bool] | None, said: set[str],
                intent_id: str) -> bool:
        event, data, user, reason, ticket = receipt
        data = json.loads(data) if isinstance(data, str) else data  # Django leaves jsonb undecoded
        data = data if isinstance(data, dict) else {}
        if event == ("upstream_2xx" if delivered else "upstream_4xx"):
            klass = 2 if delivered else 4
            return served is not None and served[0] // 100 == klass and served[1] and data.get("status") == served[0]
        if event != ("upstream_status_query_ok" if delivered else "upstream_status_query_failed"):
            return False
        if data.get("source") == "manual":
            return bool(user and reason and ticket) and self.decisions.get(intent_id) is delivered
        answer = data.get("answer")
        if delivered:
            return answer == "succeeded" and "succeeded" in said
        return (answer == "failed" and "failed" in said) or (answer == "not_found" and data.get("fenced") is True
                                                              and "not_found" in said)

    def _terminal(self, step: int) -> None:
        for intent_id, *now in _rows(LINES):
            now_t: tuple[Any, ...] = tuple(now)
            before = self.snapshots.get(intent_id)
            if before is not None and before != now_t:
                frozen = before[0] in TERMINAL["intent"]
                changed = [line for line, b, n in zip(("intent", "settlement", "fulfillment"), before, now_t,
                                                      strict=False) if b != n and (frozen or b in TERMINAL[line])]
                if changed or (frozen and before[3] != now_t[3]):
                    self.flag("TERMINAL_STATE_CHANGED", step, f"{intent_id}: {before} → {now_t}")
            self.snapshots[intent_id] = now_t
