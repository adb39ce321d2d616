"""The `alert_deliveries` job: alert emails and webhooks that failed are tried again when due
(bounded back-off, then FAILED; dunning.actions.alert_delivery)."""

from __future__ import annotations

from dunning.actions.alert_delivery import alert_delivery_attempt, due_alert_deliveries
from dunning.jobs.framework import JobReport, ahead_of_the_clock, due_in_order, scheduled_job


@scheduled_job("alert_deliveries", "try again the alert emails and webhooks whose last try failed, with bounded "
                                   "back-off; a try a dead worker left half-done counts as one")
def alert_deliveries(run: JobReport) -> None:
    if ahead_of_the_clock(run):
        return
    for pk in due_in_order(due_alert_deliveries(run.now), "next_attempt_at"):
        run.examined += 1
        run.tick()
        outcome = alert_delivery_attempt(delivery_pk=pk, now=run.now)
        if outcome in ("SENT", "SKIPPED"):
            run.changed += 1
        elif outcome in ("RETRY", "FAILED"):
            run.errors += 1
            run.note(f"alert delivery {pk}: {outcome}")
