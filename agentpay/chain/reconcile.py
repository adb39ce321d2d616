"""The on-chain reconcile job (issue 18 items 3 and 6): every undecided transaction of ours —
settlement or refund — whose `next_query_at` is due gets one round of evidence, batched and
asked in parallel, so a thousand unknowns after an outage resolve in one or two runs. Nothing
here signs: a transaction the node forgot is sent again byte for byte (the persisted raw_tx),
and one persisted but never broadcast (a crash in between) is broadcast for the first time.

Beside the queries, the on-chain deadlines the wallet's jobs do not see: an authorization that
expired before it was ever submitted, a settlement unknown past the recovery deadline (O23),
and a refund still owed past it (C08) go to their states; a confirmed refund closes its
needs-review intent (by the lead who paid it).

`run` is `agentpay.jobs.JobSummary` (not imported: jobs imports this module).
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Q

from agentpay.chain.settlement import settlement_authorization_expire, settlement_query
from agentpay.models import ChainAuthorization, ChainTransaction, PaymentIntent, RefundObligation
from agentpay.services.acceptance import intent_accept
from agentpay.services.refunds import refund_close_intent, refund_query
from agentpay.services.results import Cause, Step

log = logging.getLogger(__name__)


def _one(row: tuple[str, str | None, str | None], cause: Cause, now: datetime) -> tuple[str, Any]:
    purpose, intent_id, refund_id = row
    try:
        if purpose == "settlement":
            return "settlement", settlement_query(intent_id, cause=cause, now=now)
        return "refund", refund_query(refund_id, cause=cause, now=now)
    except Exception as exc:  # one bad row must not stop the batch; the run reports it
        log.exception("reconcile %s %s", purpose, intent_id or refund_id)
        return "error", f"{intent_id or refund_id}: {exc}"


def _chunk(rows: list[tuple[str, str | None, str | None]], cause: Cause, now: datetime) -> list[tuple[str, Any]]:
    """One worker's share, on its own database connection (closed at the end: a thread's)."""
    try:
        return [_one(row, cause, now) for row in rows]
    finally:
        connection.close()


def onchain_reconcile(run: Any) -> None:
    cause = Cause.job(run.job)
    due = list(ChainTransaction.objects.filter(next_query_at__lte=run.now).order_by("next_query_at")
               .values_list("purpose", "settlement__intent__intent_id", "refund__refund_id")
               [:settings.AGENTPAY_CHAIN_RECONCILE_BATCH])
    threads = max(1, min(settings.AGENTPAY_CHAIN_RECONCILE_THREADS, len(due)))
    if due:
        with ThreadPoolExecutor(threads, thread_name_prefix="reconcile") as pool:
            chunks = pool.map(lambda rows: _chunk(rows, cause, run.now), [due[i::threads] for i in range(threads)])
            results = [result for chunk in chunks for result in chunk]
        for kind, result in results:
            run.examined += 1
            if kind == "error":
                run.errors += 1
                run.notes.append(result)
            elif result.accepted:
                run.changed += 1
            elif result.refusal_code != "NO_NEW_EVIDENCE":
                run.refused += 1
                run.notes.append(f"{kind}: {result.refusal_code} {result.detail}"[:300])
    _deadlines(run, cause)


def _deadlines(run: Any, cause: Cause) -> None:
    now_epoch = int(run.now.astimezone(UTC).timestamp())
    # Authorized, never signed, past validBefore: submitting could only revert (seed §4.1).
    lapsed = (ChainAuthorization.objects.filter(intent__state="authorized", intent__settlements__state="not_started",
                                                valid_before__lte=now_epoch)
              .exclude(intent__settlements__chain_tx__isnull=False)
              .filter(Q(intent__processing_until__isnull=True) | Q(intent__processing_until__lte=run.now))
              .values_list("intent__intent_id", flat=True)[:500])
    for intent_id in lapsed:
        run.examined += 1
        run.count(settlement_authorization_expire(intent_id, cause=cause, now=run.now), "authorization expiry")
    # Unresolved past the recovery deadline: a settlement still unknown, or a refund still owed.
    overdue = (PaymentIntent.objects.filter(rail="onchain", state="authorized",
                                            fulfillment__recovery_deadline__lte=run.now)
               .filter(Q(settlements__state="unknown")
                       | Q(settlements__state="confirmed", fulfillment__state="failed", refund__isnull=False))
               .values_list("intent_id", flat=True)[:500])
    for intent_id in overdue:
        run.examined += 1
        run.count(intent_accept(intent_id=intent_id, cause=cause, now=run.now,
                                steps=[Step("intent", "recovery_deadline_exceeded", {"rail": "onchain"})]),
                  "recovery deadline")
    for refund_id in (RefundObligation.objects.filter(state="confirmed", intent__state="needs_review")
                      .values_list("refund_id", flat=True)[:500]):
        run.examined += 1
        run.count(refund_close_intent(refund_id, now=run.now), "refund closes the intent")
