"""ISO-8601 durations for dunning policies (SPEC §4). Pure Python: no Django.

Any ISO-8601 duration in the designator form is accepted, seconds included (`PT10S`), so that
drills and tests can run in real time. A policy window is an exact length of time, not a
calendar step, so months and years are converted at fixed lengths:

* ``1W`` = 7 days, ``1M`` (month, before ``T``) = 30 days, ``1Y`` = 365 days.

Fractions are allowed on any component (``PT0.5S``, ``P1.5D``), with ``.`` or ``,``.
Negative durations and the alternative ``PYYYY-MM-DDThh:mm:ss`` form are refused.
"""

from __future__ import annotations

import re
from datetime import timedelta

__all__ = ["format_iso_duration", "parse_iso_duration"]

_NUMBER = r"\d+(?:[.,]\d+)?"
_DURATION = re.compile(
    rf"P(?!$)(?:(?P<years>{_NUMBER})Y)?(?:(?P<months>{_NUMBER})M)?(?:(?P<weeks>{_NUMBER})W)?"
    rf"(?:(?P<days>{_NUMBER})D)?"
    rf"(?:T(?=\d)(?:(?P<hours>{_NUMBER})H)?(?:(?P<minutes>{_NUMBER})M)?(?:(?P<seconds>{_NUMBER})S)?)?"
)
_SECONDS_PER = {
    "years": 365 * 86400,
    "months": 30 * 86400,
    "weeks": 7 * 86400,
    "days": 86400,
    "hours": 3600,
    "minutes": 60,
    "seconds": 1,
}
_EXAMPLES = "e.g. P7D, PT15M, PT10S, P1DT6H"


def parse_iso_duration(text: str) -> timedelta:
    """Parse an ISO-8601 duration such as ``P7D``, ``PT15M``, ``P1DT2H`` or ``PT10S``.

    Months count as 30 days and years as 365 days (weeks as 7 days). Raises ``ValueError``
    with a message naming the text when it is not a string, malformed or negative.
    """
    if not isinstance(text, str):
        raise ValueError(f"{text!r} is not an ISO-8601 duration string ({_EXAMPLES})")
    stripped = text.strip()
    if stripped.startswith("-"):
        raise ValueError(f"{text!r} is negative; a duration must not be negative")
    match = _DURATION.fullmatch(stripped)
    if match is None:
        raise ValueError(f"{text!r} is not an ISO-8601 duration ({_EXAMPLES})")
    microseconds = 0
    for unit, value in match.groupdict().items():
        if value is not None:
            whole, _, fraction = value.replace(",", ".").partition(".")
            scaled = int(whole) * 10**6 + int((fraction + "000000")[:6])
            microseconds += scaled * _SECONDS_PER[unit]
    try:
        return timedelta(microseconds=microseconds)
    except OverflowError:
        raise ValueError(f"{text!r} is too long to be a duration") from None


def format_iso_duration(td: timedelta) -> str:
    """Format a timedelta as an ISO-8601 duration: ``P7D``, ``PT15M``, ``P1DT6H``, ``PT10S``, ``PT0S``.

    Days are never folded into weeks, months or years, so ``parse_iso_duration`` of the result
    gives back the same timedelta. A negative timedelta is shown with a leading ``-``.
    """
    if td < timedelta(0):
        return "-" + format_iso_duration(-td)
    hours, rest = divmod(td.seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    time = ""
    if hours:
        time += f"{hours}H"
    if minutes:
        time += f"{minutes}M"
    if td.microseconds:
        time += f"{seconds}.{td.microseconds:06d}".rstrip("0") + "S"
    elif seconds:
        time += f"{seconds}S"
    date = f"{td.days}D" if td.days else ""
    if not date and not time:
        return "PT0S"
    return "P" + date + (f"T{time}" if time else "")
