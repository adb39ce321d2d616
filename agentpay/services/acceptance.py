"""The one acceptance point of an intent (seed 004 §4; issue 17 item 2).

`intent_accept` is one durable transaction. It locks intent → settlement → fulfillment → wallet
(always that order, so two acceptances never deadlock on them; the wallet only for the steps
that read its balance), compares-and-sets the intent's
generation, checks each step against the seed's tables and the cross-line guards
(`agentpay.states`), applies its effect (ledger moves happen here, inside the transaction), and
writes one receipt per step and an outbox row. A refusal rolls all of it back and is recorded
in its own transaction as a refusal receipt. Nothing here touches the network.

Several steps may be asked at once (an upstream 2xx is `upstream_2xx`, `capture`,
`settlement_confirmed`): they are accepted together or not at all.

A caller that holds the rows as it wrote them (`Known`: the gateway's request, which opened the
intent a moment ago and then called the upstream) may have them decided on without the lock
read: the same checks and effects on those rows, then the generation's one statement on its own
(autocommit), whose compare-and-set on the generation the rows were written at is the guard.
Every change to any of the three lines moves the generation, so an unchanged generation means
the rows are as known. The statement's UPDATEs lock intent → settlement → fulfillment → wallet
in the same order as the lock read, and the hold's resolution is a plain INSERT: a hold resolved
already fails the statement on its unique index, and nothing of it is written. Anything else
(another generation, a refusal, that failure, a deadlock) goes the locked way, which decides
again on the rows as they are and records a refusal. `intent_accept_event` takes
one (intent id, line, event, data), the shape a conformance-vector runner drives.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from django.db import IntegrityError, OperationalError, connection, transaction

from agentpay.bridge import trusted_now, unsaved_row
from agentpay.composite import INVARIANT_VIOLATION, display_status_or_violation
from agentpay.models import (
    Fulfillment,
    IntentReceipt,
    LedgerAccount,
    OutboxMessage,
    PaymentIntent,
    Settlement,
)
from agentpay.services.accept_writes import AcceptWrites, accept_write
from agentpay.services.accept_writes import one_statement as accept_writes_one_statement
from agentpay.services.effects import EFFECTS, EffectContext
from agentpay.services.locking import lock_intent
from agentpay.services.results import Cause, Outcome, Refusal, RequestAnswer, Step
from agentpay.states import (
    FULFILLMENT,
    INTENT,
    MANUAL_INTENT_EVENTS,
    SETTLEMENT,
    TRANSITIONS,
    WALLET,
    Lines,
    step_verdict,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
REVIEW_PERMISSION = "agentpay.resolve_review"
OUTBOX_TOPIC = "agentpay.intent.changed"


def intent_accept_event(intent_id: str, line: str, event: str, data: dict[str, Any] | None = None, *,
                        cause: Cause | None = None, expect_generation: int | None = None,
                        now: datetime | None = None) -> Outcome:
    """One event on one line of one intent."""
    return intent_accept(intent_id=intent_id, steps=[Step(line, event, dict(data or {}))],
                         cause=cause or Cause.system("accept_event"), expect_generation=expect_generation, now=now)


@dataclass(frozen=True)
class Known:
    """An intent's rows as this process wrote them (the settlement with its hold): decided on
    without the lock read, the generation they were written at compared-and-set (the module's
    docstring). They are changed in memory as the steps are decided, whichever way it ends."""
    intent: PaymentIntent
    settlement: Settlement
    fulfillment: Fulfillment


# The steps decided on known rows: the upstream's answer on the wallet rail, with the capture or
# release it asks. Their effects read only the rows and write nothing of their own (a resolution
# is deferred to the generation's statement); none reads the wallet's balance.
DECIDED_ON_KNOWN_ROWS = frozenset({
    (FULFILLMENT, "upstream_2xx"), (FULFILLMENT, "upstream_4xx"), (FULFILLMENT, "upstream_5xx"),
    (FULFILLMENT, "upstream_timeout"), (SETTLEMENT, "capture"), (SETTLEMENT, "release"),
    (INTENT, "settlement_confirmed"), (INTENT, "settlement_released")})


def intent_accept(*, intent_id: str, steps: Sequence[Step], cause: Cause, expect_generation: int | None = None,
                  now: datetime | None = None, release_lease: bool = False, known: Known | None = None,
                  request_answer: RequestAnswer | None = None) -> Outcome:
    """Accept all of `steps` or none. Never raises for a refusal; raises LookupError for an
    intent that does not exist. `release_lease`: an accepted generation also clears the
    processing lease (the request holding it is done with the intent). `known`: the intent's
    rows as the caller wrote them, tried first without the lock read (the module's docstring).
    `request_answer`: the gateway request's row takes it with an accepted generation."""
    if not steps:
        raise ValueError("no steps to accept")
    now = now or trusted_now()
    if known is not None and _decidable_on_known_rows(known, steps, cause, expect_generation):
        outcome = _accept_known(known, list(steps), cause, now, release_lease, request_answer)
        if outcome is not None:
            return outcome

    def decide() -> Outcome:
        try:
            with transaction.atomic(durable=True):
                return _accept_locked(intent_id, list(steps), cause, expect_generation, now, release_lease,
                                      request_answer)
        except Refusal as refusal:
            return _record_refusal(intent_id, refusal, steps, cause, now)

    return _retry_on_deadlock(decide)


# The steps that read the wallet's balance or flags and so need its row locked first. Capture,
# release and expiry move totals by UPDATE (which locks the row then, still after the intent's
# lines and before the system account); the other steps never touch the wallet.
WALLET_READERS = frozenset({("settlement", "hold_acquired"), ("settlement", "hold_failed")})


def lines_of(intent: PaymentIntent, settlement: Settlement, fulfillment: Fulfillment) -> Lines:
    return Lines(rail=intent.rail, intent=intent.state, settlement=settlement.state, fulfillment=fulfillment.state)


def _is_manual(step: Step, cause: Cause) -> bool:
    """A person's step: a resolution of a needs-review intent, or an attestation (`source: manual`)."""
    return step.data.get("source") == "manual" or (step.line == INTENT and step.event in MANUAL_INTENT_EVENTS)


def _check_person(step: Step, cause: Cause) -> None:
    """A manual resolution is a billing lead's, with a reason and a ticket."""
    if cause.kind != "user" or cause.user is None:
        raise Refusal("MANUAL_ONLY", f"{step.event} from a person is a billing lead's, not {cause.actor}'s", step)
    if not cause.user.has_perm(REVIEW_PERMISSION):
        raise Refusal("NOT_PERMITTED", f"{cause.actor} may not resolve a needs-review intent", step)
    if not cause.reason.strip() or not cause.ticket.strip():
        raise Refusal("REASON_AND_TICKET_REQUIRED", "a manual resolution needs a reason and a ticket", step)


def _decidable_on_known_rows(known: Known, steps: Sequence[Step], cause: Cause,
                             expect_generation: int | None) -> bool:
    return (known.intent.rail == WALLET and expect_generation is None and known.intent.pk is not None
            and known.settlement.hold is not None and accept_writes_one_statement()
            and not connection.in_atomic_block  # its statement commits on its own
            and all((step.line, step.event) in DECIDED_ON_KNOWN_ROWS and not _is_manual(step, cause)
                    for step in steps))


def _accept_known(known: Known, steps: list[Step], cause: Cause, now: datetime, release_lease: bool,
                  request_answer: RequestAnswer | None) -> Outcome | None:
    """The steps decided on `known` and written by the generation's statement alone; None when
    that cannot be (the locked way decides then, nothing having been written)."""
    try:
        return _decide(known.intent, known.settlement, known.fulfillment, None, steps, cause, None, now,
                       release_lease, request_answer, exclusive_resolution=True)
    except Refusal:  # a refusal, another generation: nothing written
        return None
    except IntegrityError as exc:
        if getattr(getattr(exc.__cause__, "diag", None), "constraint_name", None) != "hold_resolved_once":
            raise
        # The hold resolved while the generation stood still: every resolution is an acceptance
        # that moves it, so this is a bug somewhere; the locked way records the refusal.
        log.error("intent %s: hold %s resolved behind its generation %s", known.intent.intent_id,
                  known.settlement.hold.transfer_id, known.intent.generation - 1)
        return None
    except OperationalError as exc:
        if getattr(exc.__cause__, "sqlstate", None) == "40P01":  # a deadlock victim wrote nothing
            return None
        raise


def _accept_locked(intent_id: str, steps: list[Step], cause: Cause, expect_generation: int | None,
                   now: datetime, release_lease: bool = False, request_answer: RequestAnswer | None = None) -> Outcome:
    intent, settlement, fulfillment, wallet = lock_intent(
        intent_id, wallet=any((step.line, step.event) in WALLET_READERS for step in steps))
    return _decide(intent, settlement, fulfillment, wallet, steps, cause, expect_generation, now, release_lease,
                   request_answer)


def _decide(intent: PaymentIntent, settlement: Settlement, fulfillment: Fulfillment, wallet: LedgerAccount | None,
            steps: list[Step], cause: Cause, expect_generation: int | None, now: datetime, release_lease: bool,
            request_answer: RequestAnswer | None = None, exclusive_resolution: bool = False) -> Outcome:
    """The steps checked and applied to these rows (locked, or known), and the generation written;
    raises Refusal. `exclusive_resolution`: a hold resolved already fails the statement
    (IntegrityError) instead of skipping the resolution."""
    generation = intent.generation
    if expect_generation is not None and expect_generation != generation:
        raise Refusal("STALE_GENERATION", f"expected generation {expect_generation}, found {generation}", steps[0])
    # The hold's capture or release is written with the generation's rows (one statement fewer).
    ctx = EffectContext(intent=intent, settlement=settlement, fulfillment=fulfillment, wallet=wallet, cause=cause,
                        now=now, defer_resolution=accept_writes_one_statement())
    rows = {"intent": intent, "settlement": settlement, "fulfillment": fulfillment}
    lines = lines_of(intent, settlement, fulfillment)
    applied: list[tuple[Step, str, str]] = []
    for step in steps:
        manual = _is_manual(step, cause)
        verdict = step_verdict(lines, step.line, step.event, manual=manual)
        if not verdict.allowed:
            raise Refusal(verdict.code, verdict.detail, step)
        if manual:  # after the tables: a terminal state is refused as terminal, whoever asks
            _check_person(step, cause)
        effect = EFFECTS.get((step.line, step.event))
        if effect is not None:
            effect(ctx, step)
        from_state = lines.state(step.line)
        to_state = TRANSITIONS[step.line][(from_state, step.event)]
        lines = lines.moved(step.line, to_state)
        row = rows[step.line]
        if to_state != from_state:
            row.state, row.state_changed_at = to_state, now
        applied.append((step, from_state, to_state))
    if release_lease:
        ctx.intent_fields["processing_until"] = None
    # Compare-and-set: the lock makes a lost update impossible here; the generation is what a
    # caller's `expect_generation` (and a stale admin form) is checked against.
    intent_fields = {"generation": generation + 1, "state": intent.state, "state_changed_at": intent.state_changed_at,
                     **ctx.intent_fields}
    moved = {step.line for step, from_state, to_state in applied if to_state != from_state}
    # A line that neither moved nor took a field is not written again (it is locked, unchanged).
    line_fields = {line: ["state", "state_changed_at", *sorted(fields)] if line in moved or fields else []
                   for line, fields in (("settlement", ctx.settlement_fields), ("fulfillment", ctx.fulfillment_fields))}
    for name, value in intent_fields.items():
        setattr(intent, name, value)
    receipts = [accepted_receipt(intent, step, from_state, to_state, intent.generation, cause, now)
                for step, from_state, to_state in applied]
    writes = AcceptWrites(
        intent=intent, loaded_generation=generation, intent_fields=intent_fields, settlement=settlement,
        settlement_fields=line_fields["settlement"], fulfillment=fulfillment,
        fulfillment_fields=line_fields["fulfillment"], receipts=receipts,
        outbox=outbox_message(intent, lines, [step for step, _, _ in applied], cause, now),
        resolution=ctx.resolution, exclusive_resolution=exclusive_resolution, request_answer=request_answer)
    written = accept_write(writes)
    if not written:
        raise Refusal("STALE_GENERATION", "the intent changed while this step was applied", steps[0])
    if ctx.resolution is not None and ctx.resolution.pk is None:  # raised out of the transaction: all rolled back
        raise Refusal("HOLD_ALREADY_RESOLVED", f"{ctx.resolution.pending.transfer_id} was already posted or voided",
                      ctx.resolution_step)
    log.info("intent %s accepted %s → generation %s", intent.intent_id,
             ", ".join(f"{s.line}.{s.event}" for s, _, _ in applied), intent.generation)
    return Outcome(accepted=True, intent_id=intent.intent_id, lines=lines, generation=intent.generation,
                   receipt_ids=tuple(r.pk for r in receipts), request_answered=writes.request_answered)


def accepted_receipt(intent: PaymentIntent, step: Step, from_state: str, to_state: str, generation: int,
                     cause: Cause, now: datetime) -> IntentReceipt:
    """The receipt of an accepted step (unsaved)."""
    return unsaved_row(
        IntentReceipt, intent=intent, line=step.line, event=step.event, accepted=True, from_state=from_state,
        to_state=to_state, generation=generation, data=_storable(step.data), cause_kind=cause.kind,
        actor=cause.actor, actor_user=cause.user, request_id=cause.request_id, reason=cause.reason,
        ticket=cause.ticket, trusted_time=now)


def outbox_message(intent: PaymentIntent, lines: Lines, steps: Sequence[Step], cause: Cause,
                   now: datetime) -> OutboxMessage:
    """The outbox row of an accepted generation (unsaved): the lines it left and the steps it took."""
    return unsaved_row(
        OutboxMessage, topic=OUTBOX_TOPIC, dedupe_key=f"{intent.intent_id}:{intent.generation}", intent=intent,
        created_at=now,
        payload={"intent_id": intent.intent_id, "generation": intent.generation, "rail": intent.rail,
                 "intent": lines.intent, "settlement": lines.settlement, "fulfillment": lines.fulfillment,
                 "display_status": _display(lines), "events": [f"{s.line}.{s.event}" for s in steps],
                 "request_id": str(cause.request_id) if cause.request_id else None, "actor": cause.actor})


def _display(lines: Lines) -> str:
    status = display_status_or_violation(lines)
    if status == INVARIANT_VIOLATION:
        log.error("no display status for %s", lines)
    return status


def _storable(data: dict[str, Any]) -> dict[str, Any]:
    """Step data as JSON PostgreSQL can keep (NULs escaped)."""
    if type(data) is dict and not data:  # most steps carry none: the round trip would give a new {}
        return {}
    return json.loads(json.dumps(data, default=str).replace("\\u0000", "\\\\u0000"))


def _record_refusal(intent_id: str, refusal: Refusal, steps: Sequence[Step], cause: Cause,
                    now: datetime) -> Outcome:
    step = refusal.step or steps[0]
    with transaction.atomic(durable=True):
        intent = PaymentIntent.objects.get(intent_id=intent_id)
        settlement = Settlement.objects.filter(intent=intent).order_by("-pk").first()
        lines = lines_of(intent, settlement, intent.fulfillment)
        from_state = lines.state(step.line) if step.line in TRANSITIONS else ""
        rolled_back = [f"{s.line}.{s.event}" for s in steps if s is not step]
        detail = refusal.detail + (f" (asked together with {', '.join(rolled_back)}, not applied)"
                                   if rolled_back else "")
        receipt = IntentReceipt.objects.create(
            intent=intent, line=step.line[:16], event=step.event[:64], accepted=False, from_state=from_state,
            generation=intent.generation, refusal_code=refusal.code, detail=detail, data=_storable(step.data),
            cause_kind=cause.kind, actor=cause.actor, actor_user=cause.user, request_id=cause.request_id,
            reason=cause.reason, ticket=cause.ticket, trusted_time=now)
    log.info("intent %s refused %s.%s: %s", intent_id, step.line, step.event, refusal)
    return Outcome(accepted=False, intent_id=intent_id, lines=lines, generation=intent.generation,
                   refusal_code=refusal.code, detail=detail, refused_step=step, receipt_ids=(receipt.pk,))


def _retry_on_deadlock(work: Callable[[], T], retries: int = 8) -> T:
    """A deadlock victim rolled back entirely; deciding again on the rows as they are now is safe."""
    for attempt in range(retries + 1):
        try:
            return work()
        except OperationalError as exc:
            if getattr(exc.__cause__, "sqlstate", None) != "40P01" or attempt == retries:
                raise
            time.sleep(random.uniform(0.005, 0.03) * (attempt + 1))
    raise AssertionError("unreachable")
