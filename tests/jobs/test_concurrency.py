"""Two workers running the same sweep at once, on separate PostgreSQL connections."""

from __future__ import annotations

from datetime import timedelta

import pytest

from dunning.jobs.framework import job_run
from dunning.models import TransitionReceipt as Receipt
from tests.support.scenarios import cycle_of, failed_renewal
from tests.support.threads import run_together

pytestmark = pytest.mark.django_db(transaction=True)


def run_concurrently(job: str, workers: int = 2):
    return run_together([lambda: job_run(job)] * workers, timeout=120)


def test_two_workers_sweeping_grace_change_each_cycle_exactly_once(sim, time_machine):
    time_machine.move_to("2026-12-01T09:00:00Z", tick=True)
    invoices = [failed_renewal(sim)[1] for _ in range(8)]
    expiry = max(cycle_of(i).grace_expires_at for i in invoices)
    time_machine.move_to(expiry + timedelta(minutes=1), tick=True)

    runs = run_concurrently("grace_expiry")

    assert sum(r.changed for r in runs) == 8 * 3, [(r.worker, r.changed, r.detail) for r in runs]
    for invoice_id in invoices:
        cycle = cycle_of(invoice_id)
        assert cycle.state == "RESTRICTED"
        accepted = list(Receipt.objects.filter(cycle=cycle, accepted=True, edge__in=(
            "expire_grace", "begin_restriction", "complete_restriction")).values_list("edge", flat=True))
        assert sorted(accepted) == ["begin_restriction", "complete_restriction", "expire_grace"]
        assert not Receipt.objects.filter(cycle=cycle, accepted=False).exists(), "claims keep workers apart"
