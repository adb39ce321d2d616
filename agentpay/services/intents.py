"""Opening an intent under a tenant's idempotency key, and the processing lease.

The key's mapping to one intent is the UNIQUE(tenant, idempotency_key) constraint on the intent
row itself: the first request inserts it (with its settlement and fulfillment, in one
transaction), every other request with the same key finds it. While a request drives the
intent it holds a lease (`processing_until`); a second request meanwhile is "in flight" (409).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q

from agentpay.bridge import unsaved_row
from agentpay.models import (
    Fulfillment,
    GatewayRequest,
    LedgerAccount,
    PaymentIntent,
    PricedRoute,
    Settlement,
    Tenant,
)
from agentpay.services import open_writes
from agentpay.services.acceptance import WALLET_READERS, accepted_receipt, outbox_message
from agentpay.services.effects import EFFECTS, EffectContext
from agentpay.services.ledger import StaleSystemAccount, SystemAccountNotCached, forget_system_ids, hold_deferrable
from agentpay.services.open_writes import (
    OpenWrites,
    WalletGuardRefused,
    open_insert_locking_wallet,
    open_is_one_statement,
    open_write,
)
from agentpay.services.results import Cause, Refusal, Step
from agentpay.states import FULFILLMENT, INITIAL, INTENT, SETTLEMENT, TRANSITIONS, WALLET, Lines, step_verdict


def request_digest(*, method: str, route_slug: str, path: str, query: str, content_type: str, body: bytes) -> str:
    """What "the same request" means for a key: method, route, path, query, content type, body."""
    h = hashlib.sha256()
    for part in (method, route_slug, path, query, content_type):
        h.update(part.encode("utf-8", "surrogatepass") + b"\x1f")
    h.update(body)
    return h.hexdigest()


@dataclass(frozen=True)
class Opened:
    intent: PaymentIntent
    created: bool
    lines: Lines | None = None  # of an intent this request inserted: the lines its steps on open left
    logged: bool = False  # the request's log row (`log`) was written with the intent
    settlement: Settlement | None = None  # of an intent this request inserted, as written (its hold on it)


def lease_for(route: PricedRoute) -> timedelta:
    return timedelta(seconds=route.connect_timeout_seconds + route.read_timeout_seconds
                     + settings.AGENTPAY_PROCESSING_LEASE_MARGIN_SECONDS)


# The steps an intent may take as it is opened (one transaction with the insert): the on-chain
# challenge, and the wallet's authorize + hold + dispatch. Their effects read no line's state, only
# the intent's own fields, the route and the wallet (dispatch only stamps the fulfillment).
ON_OPEN = frozenset({(INTENT, "challenge_issued"), (INTENT, "payload_verified"), (SETTLEMENT, "hold_acquired"),
                     (FULFILLMENT, "dispatch")})
# What those steps stamp on the intent row, written with its INSERT (no UPDATE after it).
_STAMPS = {(INTENT, "challenge_issued"): "challenged_at"}
# The ON_OPEN steps whose effects write no row before the intent's own INSERT (they make their
# rows through EffectContext.insert): an open of only these is one statement (open_writes).
DEFERRABLE = frozenset({(INTENT, "challenge_issued")})


class _NotOnOpen(Exception):
    """A step's effect refused on open: the insert is rolled back and the intent opened plainly."""


def intent_open(*, tenant: Tenant, route: PricedRoute, rail: str, idempotency_key: str, digest: str,
                forward_path: str, forward_query: str, content_type: str, body: bytes, request_id: uuid.UUID,
                now: datetime, steps: Sequence[Step] = (), lease: bool = True,
                log: GatewayRequest | None = None, wallet_read: LedgerAccount | None = None) -> Opened:
    """Insert the intent for (tenant, key), or find the one that holds the key already.

    `steps` (of ON_OPEN; the caller found no policy refusal): accepted in the open's own
    transaction, exactly as `intent_accept` would accept them on the fresh intent: checked
    against the tables one after the other, their effects run (the challenge written, the hold
    taken with the wallet locked after the intent's new rows, as the acceptance orders its
    locks), the intent, settlement and fulfillment inserted in the lines they leave, receipts
    for `opened` (generation 0) and each step (generation 1) in one INSERT, and generation 1's
    outbox row. An effect that refuses (too little balance, a frozen wallet, a network that
    cannot take the intent) rolls all of it back and the intent is opened plainly, `created`,
    for the acceptance to refuse and record. `lease=False`: no request goes on with the intent
    (a 402 is the whole answer), so no lease is taken and none is released. `log`: the request's
    row (unsaved; agentpay.api.request_log), written with the intent it opens (`logged`), in the
    same statement when the open is one; not written when the key finds an intent already.
    `wallet_read`: the tenant's wallet as read without a lock (the gateway's front read). A hold on
    it is checked on what was read and written in the open's one statement only while the wallet
    still is what the hold needs (open_writes: guarded); otherwise the open goes on as without it.
    """
    cause = Cause.request(request_id, tenant.tenant_id)
    intent = unsaved_row(
        PaymentIntent, tenant=tenant, idempotency_key=idempotency_key, request_digest=digest, rail=rail, route=route,
        amount=route.price_minor, currency=route.currency, created_at=now, state_changed_at=now,
        first_request_id=request_id, processing_until=now + lease_for(route) if lease else None,
        forward_path=forward_path, forward_query=forward_query, forward_content_type=content_type, forward_body=body)
    initial = Lines(rail=rail, intent=INITIAL[INTENT], settlement=INITIAL[SETTLEMENT],
                    fulfillment=INITIAL[FULFILLMENT])
    lines, applied = initial, []
    for step in steps:
        verdict = step_verdict(lines, step.line, step.event)
        if (step.line, step.event) not in ON_OPEN or not verdict.allowed:
            raise ValueError(f"{step.line}.{step.event} cannot be accepted on open: {verdict.code or 'not ON_OPEN'}")
        to_state = TRANSITIONS[step.line][(lines.state(step.line), step.event)]
        applied.append((step, lines.state(step.line), to_state))
        lines = lines.moved(step.line, to_state)
        if (step.line, step.event) in _STAMPS:
            setattr(intent, _STAMPS[step.line, step.event], now)
    if applied:
        intent.state, intent.generation = lines.intent, 1
    # An open that is one statement (open_writes) commits on its own in autocommit: no BEGIN and
    # COMMIT round trips around it (the 402's whole write). Inside a caller's transaction (a
    # test's), a savepoint as before, so a taken key leaves that transaction usable.
    guarded = _guarded_hold(intent, applied, wallet_read)
    deferrable = all((step.line, step.event) in DEFERRABLE for step, _, _ in applied)
    alone = open_is_one_statement() and (guarded or deferrable)
    try:
        with nullcontext() if alone and not transaction.get_connection().in_atomic_block \
                else transaction.atomic(durable=True):
            settlement = _insert(intent, initial, lines, applied, cause, now, log, wallet_read if guarded else None)
        return Opened(intent, True, lines, logged=log is not None, settlement=settlement)
    except StaleSystemAccount as exc:
        # The hold's cached system account id is stale (the open rolled back): looked up again.
        if not isinstance(exc, SystemAccountNotCached):
            forget_system_ids()
        return intent_open(tenant=tenant, route=route, rail=rail, idempotency_key=idempotency_key, digest=digest,
                           forward_path=forward_path, forward_query=forward_query, content_type=content_type,
                           body=body, request_id=request_id, now=now, steps=steps, lease=lease, log=log)
    except (_NotOnOpen, WalletGuardRefused):
        return intent_open(tenant=tenant, route=route, rail=rail, idempotency_key=idempotency_key, digest=digest,
                           forward_path=forward_path, forward_query=forward_query, content_type=content_type,
                           body=body, request_id=request_id, now=now, lease=lease, log=log)
    except IntegrityError:
        # The key is taken (perhaps by a request that committed while we waited on the index).
        existing = PaymentIntent.objects.filter(tenant=tenant, idempotency_key=idempotency_key).first()
        if existing is None:
            raise
        return Opened(existing, False)


def _guarded_hold(intent: PaymentIntent, applied: list[tuple[Step, str, str]],
                  wallet_read: LedgerAccount | None) -> bool:
    """Whether the open's hold is checked on `wallet_read` and written guarded (open_writes)."""
    return (wallet_read is not None and intent.rail == WALLET and open_is_one_statement()
            and any((step.line, step.event) in WALLET_READERS for step, _, _ in applied)
            and wallet_read.tenant_id == intent.tenant_id and wallet_read.currency == intent.currency
            and hold_deferrable(wallet_read))


def _insert(intent: PaymentIntent, initial: Lines, lines: Lines, applied: list[tuple[Step, str, str]], cause: Cause,
            now: datetime, log: GatewayRequest | None, guarded_on: LedgerAccount | None) -> Settlement:
    # An open whose steps write no row before the intent's (the challenge: DEFERRABLE) is one
    # statement on PostgreSQL (open_writes). So is a wallet's hold checked on the wallet as read
    # (`guarded`): the statement moves the wallet's totals after the intent's INSERT only while the
    # wallet still takes the hold, and writes nothing at all when it does not. Without a wallet
    # read (or a cached system account) the open inserts the intent first and locks the wallet
    # after it, then writes the hold and the rest in one statement: either way the intent's key,
    # then the wallet, then the system account.
    deferred = all((step.line, step.event) in DEFERRABLE for step, _, _ in applied)
    holds = any((step.line, step.event) in WALLET_READERS for step, _, _ in applied) and intent.rail == WALLET
    guarded, wallet = guarded_on is not None, guarded_on
    # The intent in the lines it leaves; in memory it walks them with the steps.
    if holds and not guarded:
        wallet = open_insert_locking_wallet(intent)
    elif not (deferred or guarded):
        intent.save(force_insert=True)
    settlement = unsaved_row(Settlement, intent=intent, rail=intent.rail, created_at=now, state_changed_at=now)
    fulfillment = unsaved_row(Fulfillment, intent=intent, state_changed_at=now)
    rows = {INTENT: intent, SETTLEMENT: settlement, FULFILLMENT: fulfillment}
    intent.state = initial.intent
    # The hold (when its system account's id is cached) is written with the rest of the rows.
    ctx = EffectContext(intent=intent, settlement=settlement, fulfillment=fulfillment, wallet=wallet, cause=cause,
                        now=now, deferred=[] if deferred or guarded else None,
                        defer_hold=open_writes.ONE_STATEMENT and (guarded or not intent._state.adding))
    for step, _, to_state in applied:
        effect = EFFECTS.get((step.line, step.event))
        if effect is not None:
            try:
                effect(ctx, step)
            except Refusal as refusal:
                raise _NotOnOpen(refusal.code) from None
        rows[step.line].state = to_state
    unstamped = {name: value for name, value in ctx.intent_fields.items() if getattr(intent, name) != value}
    # An effect set a field the insert could not know (none of ON_OPEN's does today).
    if unstamped and not (deferred or guarded):
        PaymentIntent.objects.filter(pk=intent.pk).update(**unstamped)
    for name, value in unstamped.items():
        setattr(intent, name, value)
    opened = Step(INTENT, "opened", {"route": intent.route.slug, "amount": intent.amount, "currency": intent.currency,
                                     "rail": intent.rail})
    receipts = [accepted_receipt(intent, opened, "", initial.intent, 0, cause, now),
                *(accepted_receipt(intent, step, from_state, to_state, 1, cause, now)
                  for step, from_state, to_state in applied)]
    outbox = outbox_message(intent, lines, [step for step, _, _ in applied], cause, now) if applied else None
    if log is not None:
        log.pk, log._state.adding = None, True  # an attempt rolled back may have given it an id
        log.intent = intent
    # The rest in one statement too (the intent's INSERT with them when it was deferred).
    hold = settlement.hold if settlement.hold_id is None and settlement.hold is not None else None
    open_write(OpenWrites(intent=intent, settlement=settlement, fulfillment=fulfillment,
                          children=[*(ctx.deferred or []), *([log] if log is not None else [])], receipts=receipts,
                          outbox=outbox, hold=hold))
    return settlement


def intent_claim_lease(*, intent: PaymentIntent, now: datetime) -> bool:
    """Take the processing lease of an intent no live request holds (a crashed one's lapsed)."""
    claimed = (PaymentIntent.objects.filter(pk=intent.pk)
               .filter(Q(processing_until__isnull=True) | Q(processing_until__lte=now))
               .update(processing_until=now + lease_for(intent.route)))
    return claimed == 1


def intent_release_lease(*, intent: PaymentIntent) -> None:
    PaymentIntent.objects.filter(pk=intent.pk).update(processing_until=None)
