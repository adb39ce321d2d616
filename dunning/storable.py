"""What PostgreSQL can store: the text and JSON checks every layer that writes hostile input asks
(the webhook intake, the API selectors, the policy publisher, the web guard in
dunning.web.input_guards, from which they moved).

PostgreSQL cannot hold NUL (U+0000) in text, jsonb or varchar, nor a lone surrogate, nor NaN or
Infinity in JSON; a value over its varchar's length overflows the column.
"""

from __future__ import annotations

import math
from typing import Any

NUL = "\x00"
ESCAPED_NUL = "\\u0000"


def escape_nul(text: str) -> str:
    """`text` with every NUL written as the six characters \\u0000, so PostgreSQL can store it."""
    return text.replace(NUL, ESCAPED_NUL)


def unstorable(value: Any, path: str = "") -> str:
    """Where a decoded JSON value holds what PostgreSQL text/jsonb cannot store ("" when nothing):
    a NUL in a string or key, a lone surrogate (not UTF-8), or NaN/Infinity (not JSON).
    Iterative, so a deeply nested document cannot exhaust the stack."""
    stack: list[tuple[str, Any]] = [(path, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            fault = _text_fault(item)
            if fault:
                return f"{where or 'value'} {fault}"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return f"{where or 'value'} is {item!r}, which JSON cannot carry"
        elif isinstance(item, dict):
            for key, child in item.items():
                name = f"{where}.{key}" if where else str(key)
                if isinstance(key, str) and _text_fault(key):
                    return f"a key under {where or 'the top level'} {_text_fault(key)}"
                stack.append((escape_nul(name), child))
        elif isinstance(item, list | tuple):
            stack.extend((f"{where}[{i}]", child) for i, child in enumerate(item))
    return ""


def _text_fault(text: str) -> str:
    if NUL in text:
        return "contains a NUL character (\\u0000)"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate (not UTF-8)"
    return ""


def storable_text(text: str, max_length: int | None = None) -> bool:
    """Whether `text` can be stored in (or compared with) a varchar of `max_length`."""
    return not _text_fault(text) and (max_length is None or len(text) <= max_length)
