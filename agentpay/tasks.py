"""Celery entry point for AgentPay's scheduled jobs (the beat schedule in config/celery.py)."""

from __future__ import annotations

from celery import shared_task

from agentpay.jobs import agentpay_job_run


@shared_task(name="agentpay.tasks.run_agentpay_job")
def run_agentpay_job(name: str) -> dict:
    run = agentpay_job_run(name)
    return {"job": name, "examined": run.examined, "changed": run.changed, "refused": run.refused,
            "errors": run.errors}
