"""The confirmed audit (issue 18 item 5's deep reorganisation, followed through).

A reorganisation deeper than the confirmation depth can take a confirmed transaction of ours —
a settlement we then delivered on, or a refund we counted as paid back — off the canonical
chain. Terminal states never change, so the line stays `confirmed`; what changes is the
evidence, and that is this module's: for a window after confirmation each such transaction is
read again (the receipt by hash, authorizationState, AuthorizationUsed — the same queries that
resolve an unknown) and anything but "confirmed" becomes a `SettlementAuditFinding`:

- dropped (the node no longer knows it and it can still land): the same persisted bytes are
  sent again, never re-signed — exactly what a submit after a lost answer does;
- seen (back in the mempool or re-mined shallower than the depth): recorded, read again later;
- failed or review (the authorization expired unused, used by someone else, a revert): money
  we counted did not move; `needs_review` so a billing lead looks;
- confirmed after an open finding: `cleared`.

A timeout records nothing but the query (the next run asks again).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q

from agentpay.chain.transactions import Broadcast, Evidence, chain_tx_broadcast, chain_tx_evidence, chain_tx_record
from agentpay.models import ChainTransaction, SettlementAuditFinding
from agentpay.models.chain import AuditAction

log = logging.getLogger(__name__)

NEEDS_A_PERSON = frozenset({"failed", "review"})


def confirmed_transactions_due(now: datetime) -> list[int]:
    since = now - timedelta(seconds=settings.AGENTPAY_CONFIRMED_AUDIT_WINDOW_SECONDS)
    asked_before = now - timedelta(seconds=settings.AGENTPAY_CONFIRMED_AUDIT_EVERY_SECONDS)
    confirmed = (Q(settlement__state="confirmed", settlement__state_changed_at__gte=since)
                 | Q(refund__state="confirmed", refund__state_changed_at__gte=since))
    return list(ChainTransaction.objects.filter(confirmed)
                .filter(Q(last_query_at__isnull=True) | Q(last_query_at__lte=asked_before))
                .order_by("last_query_at", "id").values_list("pk", flat=True)
                [:settings.AGENTPAY_CONFIRMED_AUDIT_BATCH])


def _open_finding(tx: ChainTransaction) -> SettlementAuditFinding | None:
    latest = tx.audit_findings.order_by("-found_at", "-id").first()
    return None if latest is None or latest.action == AuditAction.CLEARED else latest


def confirmed_tx_audit(tx: ChainTransaction, *, now: datetime) -> SettlementAuditFinding | None:
    """Read one confirmed transaction again; returns the finding written, if any."""
    authorization = tx.settlement.intent.authorization if tx.settlement_id else None
    evidence: Evidence = chain_tx_evidence(tx, authorization)
    chain_tx_record(tx, evidence=evidence, now=now, terminal=True)
    if evidence.kind == "timeout":
        return None
    if evidence.kind == "confirmed":
        if _open_finding(tx) is None:
            return None
        return _write(tx, evidence, now, action=AuditAction.CLEARED, needs_review=False)
    broadcast: Broadcast | None = None
    if evidence.kind == "dropped":
        broadcast = chain_tx_broadcast(tx, now=now)
    needs_review = evidence.kind in NEEDS_A_PERSON or (broadcast is not None and broadcast.kind != "ok")
    previous = _open_finding(tx)
    if (previous is not None and previous.evidence_kind == evidence.kind and broadcast is None
            and previous.needs_review == needs_review):
        return None  # the same finding, still open: one row says it
    return _write(tx, evidence, now, action=AuditAction.REBROADCAST if broadcast else AuditAction.NONE,
                  needs_review=needs_review, broadcast=broadcast)


def _write(tx: ChainTransaction, evidence: Evidence, now: datetime, *, action: str, needs_review: bool,
           broadcast: Broadcast | None = None) -> SettlementAuditFinding:
    finding = SettlementAuditFinding.objects.create(
        transaction=tx, found_at=now, evidence_kind=evidence.kind, detail=evidence.detail[:2000],
        block_number=evidence.block_number, block_hash=evidence.block_hash, action=action,
        broadcast_answer=f"{broadcast.kind}: {broadcast.detail}"[:2000] if broadcast else "",
        needs_review=needs_review)
    log.warning("confirmed audit: %s %s %s (%s)", tx.tx_id, evidence.kind, action, evidence.detail)
    return finding


def confirmed_audit(run: Any) -> None:
    """The `agentpay_confirmed_audit` job (`run` is agentpay.jobs.JobSummary)."""
    for pk in confirmed_transactions_due(run.now):
        tx = ChainTransaction.objects.select_related("network", "settlement__intent__authorization").get(pk=pk)
        run.examined += 1
        try:
            finding = confirmed_tx_audit(tx, now=run.now)
        except Exception as exc:  # one bad row must not stop the batch; the run reports it
            log.exception("confirmed audit %s", tx.tx_id)
            run.errors += 1
            run.notes.append(f"{tx.tx_id}: {exc}")
            continue
        if finding is not None:
            run.changed += 1
            run.notes.append(f"{tx.tx_id}: {finding.evidence_kind} → {finding.action}"
                             + (" (needs review)" if finding.needs_review else ""))
