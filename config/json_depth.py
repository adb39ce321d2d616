"""How deeply a JSON document nests, checked before any parser sees it.

The JSON parsers recurse once per level and stop only at the interpreter's recursion limit, and
the on-chain libraries raise that limit process-wide when imported (py_ecc and py-evm set it to
100,000): a hostile body of a few hundred kilobytes of `[` could then exhaust the C stack and
kill the worker instead of raising RecursionError. No provider event or API call nests anywhere
near MAX_JSON_DEPTH, so deeper input is refused as malformed up front.
"""

from __future__ import annotations

import io
import re

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

MAX_JSON_DEPTH = 256
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(rb"[\[\]{}]")


def json_nesting_exceeds(data: bytes | str, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether `data` (JSON text, valid or not) opens more than `limit` arrays/objects at once."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if raw.count(b"[") + raw.count(b"{") <= limit:  # the common case, at C speed
        return False
    depth = 0
    for bracket in _BRACKET.findall(_STRING.sub(b"", raw)):
        depth += 1 if bracket in (b"[", b"{") else -1
        if depth > limit:
            return True
    return False



class DepthLimitedJSONParser(JSONParser):
    """DRF's JSONParser, refusing (400 ParseError) a body nested deeper than MAX_JSON_DEPTH."""

    def parse(self, stream, media_type=None, parser_context=None):  # noqa: ANN001, ANN201
        data = stream.read() if stream is not None else b""
        if json_nesting_exceeds(data):
            raise ParseError(f"JSON parse error - nested more than {MAX_JSON_DEPTH} levels deep")
        return super().parse(io.BytesIO(data), media_type, parser_context)
