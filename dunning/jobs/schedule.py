"""The beat schedule: which job runs how often, and the order a catch-up run takes.

Pure data (no Django imports) so `config/celery.py` can read it before apps load. Order
matters after a scheduler outage: evidence first (a payment that arrived wins), then expiries,
then the steps that restrict or cancel, then messages and reports.
"""

from __future__ import annotations

# name -> cadence in seconds
JOB_CADENCE: dict[str, int] = {
    "inbox_sweep": 10,  # orphaned events (a dead worker, a lost hand-off) within seconds: jobs/inbox.py
    "unknown_payments": 300,
    "exception_expiry": 60,
    "local_retries": 60,
    "alipay_renewals": 300,  # seed 003: the merchant opens Alipay renewal orders itself: jobs/alipay_jobs.py
    "contract_deadlines": 60,
    "grace_expiry": 60,
    "restriction": 300,
    "cancellation": 3600,
    "reminders": 900,
    "outbox_relay": 10,
    "entitlement_push": 30,
    "alerts": 60,
    "alert_deliveries": 30,  # failed alert emails/webhooks, bounded back-off: jobs/alert_deliveries.py
    "reconciliation": 86400,
    "alipay_bill": 86400,  # Alipay's daily trade bill vs our payments: jobs/alipay_jobs.py
    "compensation_intake": 300,  # seed 003's compensation queue: jobs/duties.py
    "sample_review": 86400,  # one sample per ISO week; the daily run only catches up a missed week
    "purge_raw_bodies": 86400,  # raw provider bodies past RAW_BODY_RETENTION_DAYS: jobs/retention.py
}

CATCH_UP_ORDER: tuple[str, ...] = tuple(JOB_CADENCE)


def beat_schedule(task: str = "dunning.tasks.run_scheduled_job") -> dict[str, dict]:
    return {
        f"dunning:{name}": {"task": task, "schedule": float(every), "args": (name,),
                            "options": {"expires": float(max(every, 30))}}
        for name, every in JOB_CADENCE.items()
    }
