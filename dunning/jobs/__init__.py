"""Scheduled jobs (SPEC §10). Each is a Celery beat task and runnable once with
`manage.py run_jobs`."""

from __future__ import annotations

import importlib

JOB_MODULES = ("dunning.jobs.cycle_jobs", "dunning.jobs.contract_jobs", "dunning.jobs.messaging", "dunning.jobs.inbox",
               "dunning.jobs.reconciliation", "dunning.jobs.alerts",
               "entitlements.push")


def load_jobs() -> None:
    for module in JOB_MODULES:
        importlib.import_module(module)
