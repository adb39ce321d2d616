"""Release gates (SPEC §15), measured from the database.

`gates_evaluate()` computes every gate from the stored evidence, receipts, snapshots and
attempts; nothing is taken from counters kept elsewhere. Large tables are streamed (keyset
batches or `.iterator(chunk_size=...)`) and counted in SQL where the rule allows, so the report
runs on a full production database without loading it into memory.

Each gate's exact definition is in its function's docstring and in ``GATE_DEFINITIONS``
(printed by ``manage.py dunning_gates --definitions``), so the README and the code cannot drift.

`now` sets the clock for the time-relative rules only (age of unprocessed events, the
one-hour ownership deadline of unknown payments, the latency of a recovery never restored); it
does not rewind the data to that time.
"""

from __future__ import annotations

from datetime import datetime

from dunning.clock import trusted_now
from dunning.models import PAID_EVENT_TYPES

from .contract import _gate_ended_contract_access, _gate_grace_overrun
from .definitions import (
    ATTRIBUTED_OUTCOMES,
    BATCH,
    DETAIL_LIMIT,
    GATE_DEFINITIONS,
    HELD_OR_LEGITIMATE_OUTCOMES,
    LATENCY_LIMIT_SECONDS,
    NON_MOVING_EDGES,
    OWNER_DEADLINE,
    PENDING_LIMIT,
    RESTRICTING_EDGES,
)
from .evidence import _CYCLE_VIEW_FIELDS, _gate_event_attribution, _gates_root_and_full_restoration, _view
from .generations import _gate_stale_generation_commits
from .money import _gate_duplicate_charges, _gate_restriction_without_fresh_receipt
from .report import Gate, GatesReport, _Offenders, _PolicySpecs
from .timing import _gate_blind_retries, _gate_payment_to_recovery_p99, _gate_unknown_owned_within_1h

__all__ = [
    "ATTRIBUTED_OUTCOMES",
    "BATCH",
    "DETAIL_LIMIT",
    "GATE_DEFINITIONS",
    "HELD_OR_LEGITIMATE_OUTCOMES",
    "LATENCY_LIMIT_SECONDS",
    "NON_MOVING_EDGES",
    "OWNER_DEADLINE",
    "PAID_EVENT_TYPES",
    "PENDING_LIMIT",
    "RESTRICTING_EDGES",
    "Gate",
    "GatesReport",
    "gates_evaluate",
    "_CYCLE_VIEW_FIELDS",
    "_Offenders",
    "_PolicySpecs",
    "_view",
]


def gates_evaluate(*, now: datetime | None = None) -> GatesReport:
    now = now or trusted_now()
    specs = _PolicySpecs()
    gates = (
        _gate_event_attribution(now),
        *_gates_root_and_full_restoration(specs),
        _gate_duplicate_charges(),
        _gate_restriction_without_fresh_receipt(),
        _gate_stale_generation_commits(),
        _gate_payment_to_recovery_p99(now, specs),
        _gate_unknown_owned_within_1h(now),
        _gate_blind_retries(),
        _gate_grace_overrun(now),
        _gate_ended_contract_access(now, specs),
    )
    order = list(GATE_DEFINITIONS)
    return GatesReport(evaluated_at=now, gates=tuple(sorted(gates, key=lambda g: order.index(g.key))))
