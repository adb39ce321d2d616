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
    ("authorized", "hold_expired"): "expired",  # not in the seed: wallet-ledger-spec §5.5
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
    ("held", "hold_expired"): "released",  # not in the seed: wallet-ledger-spec §5.5
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


BOTH = (WALLET, ONCHAIN)
# Which rail each row of the seed's tables belongs to ("仅链上路径", "仅钱包路径", 【钱包】, 【链上】),
# and the name of its guard (the names the conformance file uses; a test compares them).
ROWS: dict[tuple[str, str, str], tuple[str, tuple[str, ...]]] = {
    (INTENT, "created", "challenge_issued"): ("onchain_challenge_persisted", (ONCHAIN,)),
    (INTENT, "created", "payload_verified"): ("wallet_api_key_and_budget_ok", (WALLET,)),
    (INTENT, "created", "policy_denied"): ("policy_denies", BOTH),
    (INTENT, "challenged", "payload_verified"): ("onchain_signature_valid", (ONCHAIN,)),
    (INTENT, "challenged", "payload_invalid"): ("onchain_payload_invalid", (ONCHAIN,)),
    (INTENT, "challenged", "timeout"): ("challenge_ttl_elapsed", (ONCHAIN,)),
    (INTENT, "authorized", "settlement_confirmed"): ("settled_and_fulfilled", BOTH),
    (INTENT, "authorized", "settlement_failed"): ("settlement_is_failed", BOTH),
    (INTENT, "authorized", "settlement_released"): ("settlement_is_released", (WALLET,)),
    (INTENT, "authorized", "authorization_expired"): ("authorization_expired_before_settlement", (ONCHAIN,)),
    (INTENT, "authorized", "hold_expired"): ("hold_expired_undispatched", (WALLET,)),
    (INTENT, "authorized", "recovery_deadline_exceeded"): ("outcome_unresolved_past_deadline", BOTH),
    (INTENT, "needs_review", "manual_resolved_confirmed"): ("billing_lead_confirms_delivered", BOTH),
    (INTENT, "needs_review", "manual_resolved_failed"): ("billing_lead_confirms_not_delivered", BOTH),
    (SETTLEMENT, "not_started", "hold_acquired"): ("hold_fits", (WALLET,)),
    (SETTLEMENT, "not_started", "hold_failed"): ("hold_refused", (WALLET,)),
    (SETTLEMENT, "held", "capture"): ("fulfillment_succeeded_full_amount", (WALLET,)),
    (SETTLEMENT, "held", "release"): ("fulfillment_failed", (WALLET,)),
    (SETTLEMENT, "held", "hold_expired"): ("hold_undispatched_past_ttl", (WALLET,)),
    (SETTLEMENT, "not_started", "submit_ok"): ("broadcast_accepted", (ONCHAIN,)),
    (SETTLEMENT, "not_started", "submit_rejected_definitely"): ("broadcast_rejected_definitely", (ONCHAIN,)),
    (SETTLEMENT, "not_started", "submit_timeout"): ("broadcast_outcome_unknown", (ONCHAIN,)),
    (SETTLEMENT, "submitted", "seen_on_chain"): ("tx_seen", (ONCHAIN,)),
    (SETTLEMENT, "submitted", "query_timeout"): ("query_timed_out", (ONCHAIN,)),
    (SETTLEMENT, "pending", "confirmations_reached"): ("confirmation_depth_reached", (ONCHAIN,)),
    (SETTLEMENT, "pending", "reverted"): ("tx_reverted", (ONCHAIN,)),
    (SETTLEMENT, "pending", "query_timeout"): ("query_timed_out", (ONCHAIN,)),
    (SETTLEMENT, "unknown", "query_found_confirmed"): ("query_shows_confirmed", (ONCHAIN,)),
    (SETTLEMENT, "unknown", "query_found_failed"): ("query_shows_failed_and_expired_unspent", (ONCHAIN,)),
    (SETTLEMENT, "unknown", "query_found_pending"): ("query_shows_pending", (ONCHAIN,)),
    (SETTLEMENT, "unknown", "query_still_unknown"): ("query_inconclusive", (ONCHAIN,)),
    (FULFILLMENT, "not_started", "dispatch"): ("settlement_ready_for_dispatch", BOTH),
    (FULFILLMENT, "in_progress", "upstream_2xx"): ("upstream_answered_2xx", BOTH),
    (FULFILLMENT, "in_progress", "upstream_4xx"): ("upstream_answered_4xx", BOTH),
    (FULFILLMENT, "in_progress", "upstream_5xx"): ("upstream_answered_other", BOTH),
    (FULFILLMENT, "in_progress", "upstream_timeout"): ("upstream_no_complete_answer", BOTH),
    (FULFILLMENT, "unknown", "upstream_status_query_ok"): ("execution_evidenced", BOTH),
    (FULFILLMENT, "unknown", "upstream_status_query_failed"): ("non_execution_evidenced", BOTH),
    (FULFILLMENT, "unknown", "recovery_deadline_exceeded"): ("deadline_passed_not_yet_recorded", BOTH),
}

# Events only a person may send (a billing lead resolving a needs-review intent), and the two
# evidence events a billing lead may attest with `source: manual` (the spec's choice C03: a
# manual resolution adds no edge to the seed's tables).
MANUAL_INTENT_EVENTS = frozenset({"manual_resolved_confirmed", "manual_resolved_failed"})
ATTESTABLE_EVENTS = frozenset({"upstream_status_query_ok", "upstream_status_query_failed"})
# Settlement events that start a settlement (need an authorized intent); the rest resolve one
# and keep applying while the intent waits in needs_review (choice C04).
SETTLEMENT_STARTS = frozenset({"hold_acquired", "hold_failed", "submit_ok", "submit_rejected_definitely",
                               "submit_timeout"})

# Refusal classes of the conformance file (its `refusal_codes`), in precedence order.
TERMINAL_STATE, RAIL_MISMATCH, NO_TRANSITION, GUARD_FAILED = ("terminal_state", "rail_mismatch", "no_transition",
                                                              "guard_failed")


def guard_of(line: str, state: str, event: str) -> str:
    return ROWS[(line, state, event)][0] if (line, state, event) in ROWS else ""


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
# The detailed codes that are not guard failures; every other code is the row's guard failing.
REFUSAL_CLASS = {"TERMINAL_STATE": TERMINAL_STATE, "RAIL_MISMATCH": RAIL_MISMATCH, "EVENT_NOT_ALLOWED": NO_TRANSITION,
                 "UNKNOWN_LINE": NO_TRANSITION}


def refusal_class(code: str) -> str:
    return REFUSAL_CLASS.get(code, GUARD_FAILED)


def step_verdict(lines: Lines, line: str, event: str, *, manual: bool = False) -> Verdict:
    """Whether `event` on `line` may be accepted from `lines` (no database needed).

    Precedence (the spec's C10): a terminal state, then the other rail's row or event, then no
    row, then the row's guard. `manual`: a billing lead's attestation (`source: manual`) or
    resolution; its reason, ticket and permission are checked by the service.
    """
    if line not in TRANSITIONS:
        return Verdict("UNKNOWN_LINE", f"no state line {line!r}; lines are {', '.join(LINES)}")
    if lines.intent in INTENT_TERMINAL:
        return Verdict("TERMINAL_STATE", f"the intent is {lines.intent}, a terminal state")
    current = lines.state(line)
    if current in TERMINAL[line]:
        return Verdict("TERMINAL_STATE", f"the {line} is {current}, a terminal state")
    row = ROWS.get((line, current, event))
    rails = row[1] if row else tuple({r for (ln, _, e), (_, rs) in ROWS.items() if ln == line and e == event
                                      for r in rs})
    if rails and lines.rail not in rails:
        # seed §1: never a silent fallback to the other rail.
        return Verdict("RAIL_MISMATCH", f"{event} from {current} is the {' and '.join(rails)} rail's; this intent "
                                        f"pays by {lines.rail}")
    if row is None:
        return Verdict("EVENT_NOT_ALLOWED", f"{event} is not a {line} transition from {current}")
    if manual and not (line == INTENT and event in MANUAL_INTENT_EVENTS) and not (
            line == FULFILLMENT and event in ATTESTABLE_EVENTS):
        return Verdict("NOT_ATTESTABLE", f"a person cannot attest {line}.{event}")
    return _cross_line(lines, line, event, manual)


def _cross_line(lines: Lines, line: str, event: str, manual: bool) -> Verdict:
    rail, s, f = lines.rail, lines.settlement, lines.fulfillment
    if line == INTENT:
        if event in MANUAL_INTENT_EVENTS and not manual:
            return Verdict("MANUAL_ONLY", f"{event} is a billing lead's resolution")
        refund_owed = rail == ONCHAIN and s == "confirmed" and f in ("failed", "not_started")
        needs = {
            "settlement_confirmed": (s == "confirmed" and f == "succeeded", "settlement confirmed and fulfillment "
                                                                            "succeeded"),
            "settlement_failed": (s == "failed", "a failed settlement"),
            # A release follows a failed fulfillment; a never-dispatched hold's release is hold_expired.
            "settlement_released": (s == "released" and f == "failed", "a released settlement after a failed "
                                                                        "fulfillment"),
            # C14: a never-dispatched hold released with it, or (wallet) no hold ever taken.
            "hold_expired": (s in ("released", "not_started") and f == "not_started",
                             "a released or never-started settlement whose fulfillment was never dispatched"),
            "authorization_expired": (s == "not_started", "a settlement not yet started"),
            "recovery_deadline_exceeded": ("unknown" in (s, f) or (refund_owed and f == "failed"),
                                           "a settlement or fulfillment in unknown (or a refund owed)"),
            "manual_resolved_confirmed": (s == "confirmed" and f == "succeeded",
                                          "confirmed and succeeded (attest delivery and capture first)"),
            "manual_resolved_failed": (s == "released" if rail == WALLET else s == "failed" or refund_owed,
                                       "a released settlement (attest non-delivery and release first)"
                                       if rail == WALLET else "a failed settlement or a refund owed"),
        }
        if event in needs and not needs[event][0]:
            return Verdict("LINES_DISAGREE", f"{event} needs {needs[event][1]}; settlement is {s}, fulfillment {f}")
        return ALLOWED
    if line == SETTLEMENT:
        if event in SETTLEMENT_STARTS and lines.intent != "authorized":
            return Verdict("LINES_DISAGREE", f"a settlement starts only for an authorized intent; it is {lines.intent}")
        if lines.intent not in ("authorized", "needs_review"):
            return Verdict("LINES_DISAGREE", f"the settlement moves only for an authorized or needs-review intent; "
                                             f"it is {lines.intent}")
        # seed §1: never capture or release while the fulfillment is unknown, whoever asks.
        if event == "capture" and f != "succeeded":
            return Verdict("NO_UPSTREAM_SUCCESS", f"capture needs a succeeded fulfillment; it is {f}")
        if event == "release" and f != "failed":
            return Verdict("FULFILLMENT_NOT_FAILED", f"release needs a failed fulfillment; it is {f}")
        # Only a hold whose call was never sent expires: once dispatched, unknown stays held.
        if event == "hold_expired" and (f != "not_started" or lines.intent != "authorized"):
            return Verdict("FULFILLMENT_DISPATCHED", f"a hold expires only for an authorized intent whose call was "
                                                     f"never dispatched; the intent is {lines.intent}, the "
                                                     f"fulfillment {f}")
        return ALLOWED
    # FULFILLMENT
    if event in ATTESTABLE_EVENTS:
        # Evidence keeps applying after the recovery deadline (C04); a person attests only then (C03).
        if manual and lines.intent != "needs_review":
            return Verdict("MANUAL_ONLY", f"a billing lead attests only for a needs-review intent; it is "
                                          f"{lines.intent}")
        if lines.intent not in ("authorized", "needs_review"):
            return Verdict("LINES_DISAGREE", f"evidence applies to an authorized or needs-review intent; it is "
                                             f"{lines.intent}")
        return ALLOWED
    if lines.intent != "authorized":
        return Verdict("LINES_DISAGREE", f"{event} needs an authorized intent; it is {lines.intent}")
    if event == "dispatch":
        ready = "held" if rail == WALLET else "confirmed"
        if s != ready:
            return Verdict("NOT_SETTLED_FOR_DISPATCH", f"dispatch on the {rail} rail needs settlement {ready}; "
                                                       f"it is {s}")
    return ALLOWED
