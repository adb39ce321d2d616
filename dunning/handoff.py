"""A Celery task a service hands stored rows to after commit.

The tasks module sits above the services (a task runs a service), so a service cannot import its
task; DunningConfig.ready names it here instead. The row is already safe when the hand-off
happens, so a broker that is down loses nothing: the hand-off logs and a sweeping job (named in
`fallback`) finds the row on its next run.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


class TaskHandoff:
    def __init__(self, what: str, fallback: str) -> None:
        self.what = what
        self.fallback = fallback
        self.task: Any = None

    def set(self, task: Any) -> None:
        self.task = task

    def enqueue(self, pk: int) -> None:
        try:
            if self.task is None:
                raise RuntimeError(f"no {self.what} task registered (DunningConfig.ready sets it)")
            self.task.delay(pk)
        except Exception:
            log.exception("%s %s stored but not handed to a worker; %s", self.what, pk, self.fallback)
