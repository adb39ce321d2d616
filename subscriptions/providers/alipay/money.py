"""Yuan strings (Alipay's wire format, e.g. ``"12.34"``) to fen (the product's minor units) and back.

Exact: ``Decimal`` only, never float. Alipay amounts have at most two decimals and are never negative."""

from __future__ import annotations

import re
from decimal import Decimal

# Digits, optionally a point and one or two digits. No sign, no exponent, no spaces, no "NaN"/"Infinity",
# no leading point (".5"), no trailing point ("5."): what is not plainly a yuan amount is refused.
_YUAN = re.compile(r"(0|[1-9][0-9]*)(\.[0-9]{1,2})?")


def yuan_to_fen(text: str) -> int:
    """``"12.34"`` → 1234. Raises ValueError on anything that is not a non-negative amount with at most
    two decimals (``"-1"``, ``"1e3"``, ``"NaN"``, ``"1.234"``, ``" 1"``, ``""``, non-strings)."""
    if not isinstance(text, str) or not _YUAN.fullmatch(text):
        raise ValueError(f"not a yuan amount: {text!r}")
    fen = Decimal(text) * 100
    if fen != fen.to_integral_value():  # unreachable with the pattern above; kept as the exactness check
        raise ValueError(f"not a whole number of fen: {text!r}")
    return int(fen)


def fen_to_yuan(fen: int) -> str:
    """1234 → ``"12.34"``; 5 → ``"0.05"``. Raises ValueError on negatives and non-integers (bool included)."""
    if not isinstance(fen, int) or isinstance(fen, bool) or fen < 0:
        raise ValueError(f"not a non-negative whole number of fen: {fen!r}")
    return f"{fen // 100}.{fen % 100:02d}"
