"""Every scheduled job, registered by importing its module (`scheduled_job` fills
`dunning.jobs.framework.JOBS`). DunningConfig.ready imports this module once, so the registry is
complete wherever Django runs: a worker, beat, `manage.py run_jobs`, a test."""

from dunning.jobs import (  # noqa: F401
    alert_deliveries,
    alerts,
    alipay_jobs,
    contract_jobs,
    cycle_jobs,
    duties,
    inbox,
    messaging,
    reconciliation,
    retention,
)
from entitlements import jobs as entitlement_jobs  # noqa: F401
