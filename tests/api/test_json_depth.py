"""JSON nested deeper than any real document is refused before a parser recurses into it: the
on-chain libraries raise the interpreter's recursion limit to 100,000 process-wide, so the
parser's RecursionError no longer stops a hostile body before the C stack does."""

from __future__ import annotations

import io
import sys

import pytest
from rest_framework.exceptions import ParseError

from config.json_depth import MAX_JSON_DEPTH, DepthLimitedJSONParser, json_nesting_exceeds
from tests.api.test_alert_actions import raise_alert

DEEP = b"[" * 50_000 + b"]" * 50_000


def test_the_chain_libraries_really_raise_the_recursion_limit():
    import eth_account  # noqa: F401 — py_ecc sets the limit when imported

    assert sys.getrecursionlimit() >= 100_000  # why the explicit depth check exists


@pytest.mark.parametrize(("text", "deeper"), [
    (b'{"a": [1, {"b": 2}]}', False),
    (b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH, False),
    (b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1), True),
    (b'["' + b"[" * 5000 + b'"]', False),  # brackets inside a string do not nest
    (b'["\\"' + b"[" * 5000 + b'"]', False),  # nor after an escaped quote
    (b'{"x":' * 300 + b"1" + b"}" * 300, True),
    (DEEP, True),
    ("[" * 300, True),  # text too, and unbalanced
])
def test_nesting_is_measured_outside_strings(text, deeper):
    assert json_nesting_exceeds(text) is deeper


def test_the_api_parser_refuses_a_deep_body_and_parses_the_rest():
    parser = DepthLimitedJSONParser()
    with pytest.raises(ParseError, match="nested more than"):
        parser.parse(io.BytesIO(DEEP), "application/json", {})
    assert parser.parse(io.BytesIO(b'{"note": "[[["}'), "application/json", {}) == {"note": "[[["}


def test_a_deep_body_to_the_rest_api_is_a_400_problem(db, lead_client):
    alert = raise_alert()
    response = lead_client.post(f"/api/v1/alerts/{alert.pk}/acknowledge", data=DEEP, content_type="application/json",
                                HTTP_IDEMPOTENCY_KEY="deep-1")
    assert response.status_code == 400, response.content[:300]
    assert "nested more than" in response.content.decode()
