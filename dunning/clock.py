"""The one trusted clock.

Every guard that compares against "now" (grace expiry, exception expiry, unknown-payment
ownership deadlines) reads time here, and every job takes `now` as a parameter that defaults
to this function, so tests and catch-up runs can inject time.
"""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone


def trusted_now() -> datetime:
    return timezone.now()
