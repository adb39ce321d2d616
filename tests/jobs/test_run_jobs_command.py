"""`manage.py run_jobs` and the beat schedule cover every job of SPEC §10."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from agentpay.schedule import JOB_CADENCE as AGENTPAY_JOB_CADENCE
from config.celery import app
from dunning.jobs.framework import JOBS
from dunning.jobs.schedule import CATCH_UP_ORDER
from dunning.models import JobRun

SPEC_JOBS = {"grace_expiry", "restriction", "cancellation", "unknown_payments", "exception_expiry", "local_retries",
             "outbox_relay", "reminders", "reconciliation", "alerts", "inbox_sweep",
             "entitlement_push", "contract_deadlines", "alert_deliveries", "purge_raw_bodies"}
SPEC_JOBS |= {"compensation_intake", "sample_review"}  # seed 003's duties (issue 19 item 3): dunning/jobs/duties.py
SPEC_JOBS |= {"alipay_renewals", "alipay_bill"}  # seed 003's Alipay renewals and daily bill (issue 20)


def test_every_job_is_registered_scheduled_and_ordered():
    assert set(JOBS) == SPEC_JOBS == set(CATCH_UP_ORDER)
    by_task: dict[str, set[str]] = {}
    for entry in app.conf.beat_schedule.values():
        by_task.setdefault(entry["task"], set()).add(entry["args"][0])
    # Beat runs dunning's jobs and AgentPay's (agentpay.schedule), each through its own task.
    assert by_task.pop("dunning.tasks.run_scheduled_job") == SPEC_JOBS
    assert by_task == {"agentpay.tasks.run_agentpay_job": set(AGENTPAY_JOB_CADENCE)}


def test_list_prints_each_job(db):
    out = io.StringIO()
    call_command("run_jobs", "--list", stdout=out)
    assert [line.split()[0] for line in out.getvalue().splitlines()] == list(CATCH_UP_ORDER)


def test_one_job_runs_and_is_recorded(db):
    out = io.StringIO()
    call_command("run_jobs", "--job", "exception_expiry", "--now", "2026-12-01T09:00:00Z", stdout=out)
    run = JobRun.objects.get(job="exception_expiry")
    assert run.status == "OK" and run.run_for.isoformat() == "2026-12-01T09:00:00+00:00"
    assert "exception_expiry OK" in out.getvalue()


def test_bad_arguments_are_explained(db):
    with pytest.raises(CommandError, match="unknown job"):
        call_command("run_jobs", "--job", "nope")
    with pytest.raises(CommandError, match="UTC offset"):
        call_command("run_jobs", "--job", "alerts", "--now", "yesterday")


def test_a_job_with_errors_makes_the_command_fail(sim, time_machine):
    from tests.support.scenarios import failed_renewal

    time_machine.move_to("2026-12-01T09:00:00Z", tick=True)
    _, _, cycle = failed_renewal(sim)
    time_machine.move_to(cycle.grace_expires_at.isoformat(), tick=True)
    sim.faults.error_500("GET /v1/invoices/*", count=20)
    with pytest.raises(SystemExit) as exit_info:
        call_command("run_jobs", "--job", "grace_expiry", stdout=io.StringIO(), stderr=io.StringIO())
    assert exit_info.value.code == 1
    assert JobRun.objects.get(job="grace_expiry").status == "PARTIAL"


def test_the_beat_task_runs_a_job(db):
    from dunning.tasks import run_scheduled_job

    assert run_scheduled_job.delay("alerts").get() == "OK"
    assert JobRun.objects.filter(job="alerts").count() == 1
