"""Deadlock victims are retried, not failed.

Foreign-key checks take KEY SHARE locks on referenced rows at commit, so a write that merely
points at a subscription, invoice or cycle can meet an acceptance holding those rows FOR UPDATE
in the opposite order. PostgreSQL then rolls one transaction back (SQLSTATE 40P01); running it
again is always safe, because nothing of it was kept.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import OperationalError

T = TypeVar("T")
DEADLOCK_RETRIES = 8
log = logging.getLogger(__name__)


def is_deadlock(exc: OperationalError) -> bool:
    return getattr(exc.__cause__, "sqlstate", None) == "40P01"


def retry_on_deadlock(work: Callable[[], T], *, what: str) -> T:
    for attempt in range(DEADLOCK_RETRIES + 1):
        try:
            return work()
        except OperationalError as exc:
            if not is_deadlock(exc) or attempt == DEADLOCK_RETRIES:
                raise
            log.warning("%s was a deadlock victim; retrying", what)
            # A little random back-off so the same transactions do not collide again in step.
            time.sleep(random.uniform(0.005, 0.03) * (attempt + 1))
    raise AssertionError("unreachable")
