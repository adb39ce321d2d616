"""The three state lines of seed 004 §4, as data, and the cross-line guards as pure functions.

The tables are copied from the seed row by row (its §4.1, §4.2, §4.3) and nothing else: any
(state, event) pair not listed here is refused by the acceptance service. The guards read only
the three lines' states, the rail and whether a person resolves a review, so the same rules
drive the acceptance service, the reachability walk of the composite-view tests and, later, the
conformance-vector runner. Guards that need the database (balance, deadlines) live in
`agentpay.services.effects`.
"""

from __future__ import annotations

from dataclasses import dataclass

INTENT = "intent"
SETTLEMENT = "settlement"
FULFILLMENT = "fulfillment"
LINES = (INTENT, SETTLEMENT, FULFILLMENT)

WALLET = "wallet"
ONCHAIN = "onchain"
RAILS = (WALLET, ONCHAIN)

# seed §4.1 PaymentIntent: (state, event) -> new state
INTENT_TRANSITIONS: dict[tuple[str, str], str] = {
    ("created", "challenge_issued"): "challenged",
    ("created", "payload_verified"): "authorized",
    ("created", "policy_denied"): "rejected",
    ("challenged", "payload_verified"): "authorized",
    ("challenged", "payload_invalid"): "rejected",
    ("challenged", "timeout"): "expired",
    ("authorized", "settlement_confirmed"): "completed",
    ("authorized", "settlement_failed"): "failed",
    ("authorized", "settlement_released"): "failed",
    ("authorized", "authorization_expired"): "expired",
    ("authorized", "recovery_deadline_exceeded"): "needs_review",
    ("needs_review", "manual_resolved_confirmed"): "completed",
    ("needs_review", "manual_resolved_failed"): "failed",
}

# seed §4.2 Settlement (both rails)
SETTLEMENT_TRANSITIONS: dict[tuple[str, str], str] = {
    ("not_started", "hold_acquired"): "held",
    ("not_started", "hold_failed"): "failed",
    ("held", "capture"): "confirmed",
    ("held", "release"): "released",
    ("not_started", "submit_ok"): "submitted",
    ("not_started", "submit_rejected_definitely"): "failed",
    ("not_started", "submit_timeout"): "unknown",
    ("submitted", "seen_on_chain"): "pending",
    ("submitted", "query_timeout"): "unknown",
    ("pending", "confirmations_reached"): "confirmed",
    ("pending", "reverted"): "failed",
    ("pending", "query_timeout"): "unknown",
    ("unknown", "query_found_confirmed"): "confirmed",
    ("unknown", "query_found_failed"): "failed",
    ("unknown", "query_found_pending"): "pending",
    ("unknown", "query_still_unknown"): "unknown",
}

# seed §4.3 Fulfillment
FULFILLMENT_TRANSITIONS: dict[tuple[str, str], str] = {
    ("not_started", "dispatch"): "in_progress",
    ("in_progress", "upstream_2xx"): "succeeded",
    ("in_progress", "upstream_4xx"): "failed",
    ("in_progress", "upstream_5xx"): "unknown",
    ("in_progress", "upstream_timeout"): "unknown",
    ("unknown", "upstream_status_query_ok"): "succeeded",
    ("unknown", "upstream_status_query_failed"): "failed",
    ("unknown", "recovery_deadline_exceeded"): "unknown",
}

TRANSITIONS: dict[str, dict[tuple[str, str], str]] = {
    INTENT: INTENT_TRANSITIONS,
    SETTLEMENT: SETTLEMENT_TRANSITIONS,
    FULFILLMENT: FULFILLMENT_TRANSITIONS,
}
INITIAL = {INTENT: "created", SETTLEMENT: "not_started", FULFILLMENT: "not_started"}

# seed §1: terminal states are read-only; only audit rows are appended.
INTENT_TERMINAL = frozenset({"completed", "failed", "expired", "rejected"})
SETTLEMENT_TERMINAL = frozenset({"confirmed", "released", "failed"})
FULFILLMENT_TERMINAL = frozenset({"succeeded", "failed"})
TERMINAL = {INTENT: INTENT_TERMINAL, SETTLEMENT: SETTLEMENT_TERMINAL, FULFILLMENT: FULFILLMENT_TERMINAL}


def states_of(line: str) -> tuple[str, ...]:
    table = TRANSITIONS[line]
    seen = dict.fromkeys([INITIAL[line], *(s for s, _ in table), *table.values()])
    return tuple(seen)


def events_of(line: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(e for _, e in TRANSITIONS[line]))


WALLET_SETTLEMENT_EVENTS = frozenset({"hold_acquired", "hold_failed", "capture", "release"})
ONCHAIN_SETTLEMENT_EVENTS = frozenset(events_of(SETTLEMENT)) - WALLET_SETTLEMENT_EVENTS
# Intent events the seed marks as one rail's ("仅链上路径", "仅钱包路径", "钱包路径").
ONCHAIN_INTENT_EVENTS = frozenset({"challenge_issued", "payload_invalid", "timeout", "authorization_expired"})
WALLET_INTENT_EVENTS = frozenset({"settlement_released"})
# Events only a person may send (a billing lead resolving a needs-review intent).
MANUAL_INTENT_EVENTS = frozenset({"manual_resolved_confirmed", "manual_resolved_failed"})


@dataclass(frozen=True)
class Lines:
    """The three states of one intent at one moment, and its rail."""

    rail: str
    intent: str
    settlement: str
    fulfillment: str

    def state(self, line: str) -> str:
        return getattr(self, line)

    def moved(self, line: str, to: str) -> Lines:
        return Lines(**{**self.__dict__, line: to})


@dataclass(frozen=True)
class Verdict:
    """Why a step is refused ('' code: allowed)."""

    code: str = ""
    detail: str = ""

    @property
    def allowed(self) -> bool:
        return not self.code


ALLOWED = Verdict()


def step_verdict(lines: Lines, line: str, event: str, *, manual: bool = False) -> Verdict:
    """Whether `event` on `line` may be accepted from `lines` (no database needed).

    `manual`: a billing lead resolving a needs-review intent (reason and ticket are checked by
    the service); only then may a capture or release run while fulfillment is unknown.
    """
    if line not in TRANSITIONS:
        return Verdict("UNKNOWN_LINE", f"no state line {line!r}; lines are {', '.join(LINES)}")
    if lines.intent in INTENT_TERMINAL:
        return Verdict("TERMINAL_STATE", f"the intent is {lines.intent}, a terminal state")
    current = lines.state(line)
    if current in TERMINAL[line]:
        return Verdict("TERMINAL_STATE", f"the {line} is {current}, a terminal state")
    if (current, event) not in TRANSITIONS[line]:
        return Verdict("EVENT_NOT_ALLOWED", f"{event} is not a {line} transition from {current}")
    return _cross_line(lines, line, event, manual)


def _cross_line(lines: Lines, line: str, event: str, manual: bool) -> Verdict:
    rail, s, f = lines.rail, lines.settlement, lines.fulfillment
    if line == INTENT:
        if event in ONCHAIN_INTENT_EVENTS and rail != ONCHAIN:
            return Verdict("RAIL_MISMATCH", f"{event} belongs to the on-chain rail; this intent pays by {rail}")
        if event in WALLET_INTENT_EVENTS and rail != WALLET:
            return Verdict("RAIL_MISMATCH", f"{event} belongs to the wallet rail; this intent pays by {rail}")
        if event == "payload_verified":
            # created → authorized is the wallet's path, challenged → authorized the chain's.
            expected_rail = WALLET if lines.intent == "created" else ONCHAIN
            if rail != expected_rail:
                return Verdict("RAIL_MISMATCH", f"payload_verified from {lines.intent} is the {expected_rail} rail's")
        if event in MANUAL_INTENT_EVENTS and not manual:
            return Verdict("MANUAL_ONLY", f"{event} is a billing lead's resolution")
        needs = {
            "settlement_confirmed": (s == "confirmed" and f == "succeeded", "settlement confirmed and fulfillment "
                                                                            "succeeded"),
            "settlement_failed": (s == "failed", "a failed settlement"),
            "settlement_released": (s == "released", "a released settlement"),
            "authorization_expired": (s == "not_started", "a settlement not yet started"),
            "recovery_deadline_exceeded": ("unknown" in (s, f), "a settlement or fulfillment in unknown"),
            "manual_resolved_confirmed": (s == "confirmed", "a confirmed settlement (capture first)"),
            "manual_resolved_failed": (s in ("released", "failed"), "a released or failed settlement "
                                                                     "(release first)"),
        }
        if event in needs and not needs[event][0]:
            return Verdict("LINES_DISAGREE", f"{event} needs {needs[event][1]}; settlement is {s}, fulfillment {f}")
        return ALLOWED
    if line == SETTLEMENT:
        if event in WALLET_SETTLEMENT_EVENTS and rail != WALLET:
            return Verdict("RAIL_MISMATCH", f"{event} is a wallet settlement event; this intent pays by {rail}")
        if event in ONCHAIN_SETTLEMENT_EVENTS and rail != ONCHAIN:
            # seed §1: never fall back silently from the wallet to the chain.
            return Verdict("RAIL_MISMATCH", f"{event} is an on-chain settlement event; this intent pays by {rail}")
        if lines.intent != "authorized" and not (manual and lines.intent == "needs_review"):
            return Verdict("LINES_DISAGREE", f"settlement moves only for an authorized intent; it is {lines.intent}")
        if event == "capture" and f != "succeeded" and not manual:
            return Verdict("NO_UPSTREAM_SUCCESS", f"capture needs a succeeded fulfillment; it is {f}")
        if event == "release" and f != "failed" and not manual:
            return Verdict("FULFILLMENT_NOT_FAILED", f"release needs a failed fulfillment; it is {f}")
        if manual and lines.intent != "needs_review":
            return Verdict("MANUAL_ONLY", "a manual capture or release is only for an intent in needs_review")
        return ALLOWED
    # FULFILLMENT
    if lines.intent != "authorized":
        return Verdict("LINES_DISAGREE", f"fulfillment moves only for an authorized intent; it is {lines.intent}")
    if event == "dispatch":
        ready = "held" if rail == WALLET else "confirmed"
        if s != ready:
            return Verdict("NOT_SETTLED_FOR_DISPATCH", f"dispatch on the {rail} rail needs settlement {ready}; "
                                                       f"it is {s}")
    return ALLOWED
