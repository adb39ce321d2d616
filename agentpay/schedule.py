"""AgentPay's beat schedule: pure data (no Django imports), so config/celery.py can read it
before the apps load. `agentpay.jobs.JOBS` holds the functions under the same names."""

from __future__ import annotations

JOB_CADENCE: dict[str, int] = {
    "agentpay_challenge_expiry": 30,  # seed §4.1: challenge TTL 300 s
    "agentpay_hold_expiry": 60,  # an undispatched hold is released after 300 s (wallet-ledger-spec §5.5)
    "agentpay_fulfillment_status_query": 30,
    "agentpay_recovery_deadline": 60,  # also gives every needs-review intent an owner
    "agentpay_outbox_relay": 5,  # publishes committed outbox rows (agentpay.services.outbox)
    "agentpay_onchain_reconcile": 5,  # settle (issue 18): due chain queries back off 1 s … 60 s each
    "agentpay_confirmed_audit": 60,  # each confirmed tx is read again every 600 s for a day
}


def beat_schedule(task: str = "agentpay.tasks.run_agentpay_job") -> dict[str, dict]:
    return {f"agentpay:{name}": {"task": task, "schedule": float(every), "args": (name,),
                                 "options": {"expires": float(max(every, 30))}}
            for name, every in JOB_CADENCE.items()}
