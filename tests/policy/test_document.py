"""Unit tests for dunning.policy.document and dunning.policy.durations (SPEC §4). No database."""

from __future__ import annotations

import ast
import copy
import dataclasses
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from dunning.policy.document import (
    FAILURE_CLASSES,
    INVOICE_STATUSES,
    PROFILES,
    SCHEMA_ID,
    PolicyValidationError,
    load_policy,
    parse_policy_text,
    validate_policy,
)
from dunning.policy.durations import format_iso_duration, parse_iso_duration

POLICY_DIR = Path(__file__).resolve().parents[2] / "dunning" / "policy" / "shipped"
SHIPPED = ("standard-monthly", "annual-no-grace", "local-retry-monthly", "default-catch-all")
DEFAULT_STATUSES = {
    "draft": "CLOSED", "open": "BLOCKING", "paid": "CLOSED", "void": "CLOSED", "uncollectible": "BLOCKING",
}

# The SPEC §4 example, less its `retry_intervals` line: that line is LOCAL only and the example's
# retry authority is PAYMENT_PROVIDER.
SPEC_EXAMPLE = """
schema: subscription.dunningPolicy.v1
policy: standard-monthly@6
provider: {name: stripe, account: acct_123}
applies_to: {prices: [price_monthly_pro, price_monthly_team], cohort: default}
invoice_status_mapping: {open: BLOCKING, uncollectible: BLOCKING, void: CLOSED, paid: CLOSED}
dispute_lost: BLOCKING
retryAuthority: PAYMENT_PROVIDER
maxAttempts: 4
failure_classes: {insufficient_funds: RETRYABLE, expired_card: CUSTOMER_ACTION, stolen_card: NON_RETRYABLE}
grace: {starts: FIRST_FAILURE, duration: P7D, profile: READ_EXPORT_NO_NEW_JOBS}
restrictAfter: GRACE_EXPIRED_AND_INVOICE_OPEN
restricted_profile: SUSPENDED
recoverOn: INVOICE_PAID_RECEIPT
recover_with_remaining_debt: false
cancelAfter: MANUAL_OR_POLICY_TERMINAL
cancel_after_restricted: P30D
notifications: {template_generation: 3, reminders_before_grace_end: [P3D, P1D]}
exceptions: {max_duration: P14D, requires: [owner, reason, ticket]}
clock: DATABASE
mode: ENFORCE
rollout: {percent: 100, cohort: default}
"""


def spec_doc(**changes: Any) -> dict[str, Any]:
    """The spec example as a mapping; ``changes`` set top-level keys (None deletes)."""
    doc = yaml.safe_load(SPEC_EXAMPLE)
    for key, value in changes.items():
        if value is None:
            doc.pop(key, None)
        else:
            doc[key] = value
    return doc


def errors_of(doc: dict[str, Any]) -> list[str]:
    with pytest.raises(PolicyValidationError) as caught:
        validate_policy(doc)
    return caught.value.errors


def local_doc(**changes: Any) -> dict[str, Any]:
    doc = spec_doc(retryAuthority="LOCAL", retry_intervals=["PT15M", "PT6H", "P1D"])
    doc.update(changes)
    return doc


# --- durations ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("PT10S", timedelta(seconds=10)),
        ("P7D", timedelta(days=7)),
        ("PT15M", timedelta(minutes=15)),
        ("P1DT6H", timedelta(days=1, hours=6)),
        ("P1DT2H", timedelta(days=1, hours=2)),
        ("PT0S", timedelta(0)),
        ("P1W", timedelta(days=7)),
        ("P1M", timedelta(days=30)),
        ("P1Y", timedelta(days=365)),
        ("P1Y2M3DT4H5M6S", timedelta(days=365 + 60 + 3, hours=4, minutes=5, seconds=6)),
        ("PT0.5S", timedelta(milliseconds=500)),
        ("P1,5D", timedelta(days=1, hours=12)),
    ],
)
def test_parse_iso_duration(text: str, expected: timedelta) -> None:
    assert parse_iso_duration(text) == expected


@pytest.mark.parametrize("text", ["", "P", "PT", "7D", "P7", "P1DT", "p7d", "PT1H2", "P1S", "P7D ", "1 week"])
def test_parse_iso_duration_rejects_malformed(text: str) -> None:
    if text == "P7D ":  # surrounding whitespace is tolerated
        assert parse_iso_duration(text) == timedelta(days=7)
        return
    with pytest.raises(ValueError, match="is not an ISO-8601 duration"):
        parse_iso_duration(text)


def test_parse_iso_duration_rejects_negative_and_non_strings() -> None:
    with pytest.raises(ValueError, match="negative"):
        parse_iso_duration("-P1D")
    with pytest.raises(ValueError, match="not an ISO-8601 duration string"):
        parse_iso_duration(7)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("td", "text"),
    [
        (timedelta(days=7), "P7D"),
        (timedelta(minutes=15), "PT15M"),
        (timedelta(days=1, hours=6), "P1DT6H"),
        (timedelta(seconds=10), "PT10S"),
        (timedelta(0), "PT0S"),
        (timedelta(days=30), "P30D"),
        (timedelta(hours=1, minutes=2, seconds=3), "PT1H2M3S"),
        (timedelta(milliseconds=500), "PT0.5S"),
        (timedelta(days=-1), "-P1D"),
    ],
)
def test_format_iso_duration(td: timedelta, text: str) -> None:
    assert format_iso_duration(td) == text
    if td >= timedelta(0):
        assert parse_iso_duration(text) == td


# --- parsing text ---------------------------------------------------------------------------


def test_yaml_and_json_parse_to_the_same_mapping() -> None:
    assert parse_policy_text(SPEC_EXAMPLE) == parse_policy_text(json.dumps(spec_doc(), indent=2))


@pytest.mark.parametrize(
    ("text", "start"),
    [
        ("schema: [unclosed", "document: not valid YAML: "),
        ('{"schema": "x" "policy": "y"}', "document: not valid JSON: "),
        ("- just\n- a list\n", "document: top level must be a mapping of policy fields, got list"),
        ('"a string"', "document: top level must be a mapping of policy fields, got str"),
        ("   \n", "document: empty"),
        ("# only a comment\n", "document: top level must be a mapping of policy fields, got nothing"),
    ],
)
def test_parse_policy_text_faults(text: str, start: str) -> None:
    with pytest.raises(PolicyValidationError) as caught:
        parse_policy_text(text)
    assert len(caught.value.errors) == 1
    assert caught.value.errors[0].startswith(start)


def test_yaml_syntax_error_names_the_line() -> None:
    with pytest.raises(PolicyValidationError, match=r"line 2"):
        parse_policy_text("schema: x\npolicy: [a\n")


@pytest.mark.parametrize(
    "text",
    [
        "retryAuthority: LOCAL\nmaxAttempts: 2\nretryAuthority: PAYMENT_PROVIDER\n",
        '{"retryAuthority": "LOCAL", "retryAuthority": "PAYMENT_PROVIDER"}',
    ],
)
def test_a_key_given_twice_in_the_text_is_refused(text: str) -> None:
    with pytest.raises(PolicyValidationError) as caught:
        parse_policy_text(text)
    assert caught.value.errors[0].startswith("document: field 'retryAuthority' is given twice")


def test_yaml_flow_mapping_that_is_not_json_is_read_as_yaml() -> None:
    assert parse_policy_text("{schema: x, mode: ENFORCE}") == {"schema": "x", "mode": "ENFORCE"}


# --- shipped policies -----------------------------------------------------------------------


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_policy_validates(name: str) -> None:
    document = load_policy((POLICY_DIR / f"{name}.yaml").read_text())
    assert document.name == name
    assert document.provider_name == "stripe"
    assert document.provider_account == "acct_demo"
    assert document.mode == "ENFORCE"


@pytest.mark.parametrize("name", SHIPPED)
def test_digest_is_the_same_for_yaml_and_json_renderings(name: str) -> None:
    text = (POLICY_DIR / f"{name}.yaml").read_text()
    as_json = json.dumps(yaml.safe_load(text), indent=4)
    assert load_policy(text).digest() == load_policy(as_json).digest()


@pytest.mark.parametrize("name", SHIPPED)
def test_canonical_document_loads_again_to_itself(name: str) -> None:
    document = load_policy((POLICY_DIR / f"{name}.yaml").read_text())
    again = load_policy(json.dumps(document.canonical))
    assert again.canonical == document.canonical
    assert again == document
    assert hash(again) == hash(document)


def test_standard_monthly_is_the_spec_example() -> None:
    shipped = load_policy((POLICY_DIR / "standard-monthly.yaml").read_text())
    spec = load_policy(SPEC_EXAMPLE)
    assert dataclasses.replace(shipped, provider_account="acct_123", canonical=spec.canonical) == spec
    assert shipped.identity == "standard-monthly@6"
    assert shipped.version == 6
    assert shipped.prices == ("price_monthly_pro", "price_monthly_team")


def test_annual_no_grace_is_its_own_policy() -> None:
    annual = load_policy((POLICY_DIR / "annual-no-grace.yaml").read_text())
    assert annual.identity == "annual-no-grace@1"
    assert set(annual.prices) == {"price_annual_pro", "plan_annual_legacy"}
    assert annual.retry_authority == "PAYMENT_PROVIDER"
    assert annual.max_attempts == 2
    assert not annual.has_grace
    assert annual.grace_starts == "NO_GRACE"
    assert annual.grace_duration == timedelta(0)
    assert annual.grace_profile == annual.restricted_profile == "SUSPENDED"
    assert annual.reminders_before_grace_end == ()
    assert annual.cancel_after_restricted == timedelta(days=60)
    assert annual.exception_max_duration == timedelta(days=30)
    for code in ("stolen_card", "lost_card", "fraudulent"):
        assert annual.failure_class_for(code) == "NON_RETRYABLE"
    assert annual.failure_class_for("expired_card") == "CUSTOMER_ACTION"


def test_local_retry_monthly_uses_the_seed_schedule() -> None:
    local = load_policy((POLICY_DIR / "local-retry-monthly.yaml").read_text())
    assert local.retry_authority == "LOCAL"
    assert local.max_attempts == 4
    assert local.retry_intervals == (timedelta(minutes=15), timedelta(hours=6), timedelta(days=1))
    assert local.grace_duration == timedelta(days=7)
    assert local.grace_profile == "LIMITED"
    assert local.reminders_before_grace_end == (timedelta(days=3), timedelta(days=1))


def test_default_catch_all_catches_every_price() -> None:
    catch_all = load_policy((POLICY_DIR / "default-catch-all.yaml").read_text())
    assert catch_all.is_default
    assert catch_all.prices == ()
    assert catch_all.grace_profile == "READ_EXPORT_NO_NEW_JOBS"
    assert catch_all.cancel_after == "MANUAL_ONLY"
    assert catch_all.cancel_after_restricted is None


def test_policy_document_has_no_django_imports() -> None:
    for module in ("document.py", "durations.py"):
        tree = ast.parse((POLICY_DIR.parent / module).read_text())
        nodes = list(ast.walk(tree))
        imported = [alias.name for node in nodes if isinstance(node, ast.Import) for alias in node.names]
        imported += [node.module or "" for node in nodes if isinstance(node, ast.ImportFrom)]
        assert not [name for name in imported if name.startswith(("django", "rest_framework"))]


# --- the document ---------------------------------------------------------------------------


def test_spec_example_fields() -> None:
    doc = load_policy(SPEC_EXAMPLE)
    assert (doc.name, doc.version, doc.identity) == ("standard-monthly", 6, "standard-monthly@6")
    assert (doc.provider_name, doc.provider_account, doc.cohort) == ("stripe", "acct_123", "default")
    assert doc.is_default is False
    assert doc.invoice_status_mapping == DEFAULT_STATUSES
    assert set(doc.invoice_status_mapping) == set(INVOICE_STATUSES)
    assert doc.dispute_lost == "BLOCKING"
    assert doc.retry_authority == "PAYMENT_PROVIDER"
    assert doc.retry_intervals == ()
    assert (doc.has_grace, doc.grace_starts, doc.grace_duration) == (True, "FIRST_FAILURE", timedelta(days=7))
    assert doc.grace_profile == "READ_EXPORT_NO_NEW_JOBS"
    assert doc.restricted_profile == "SUSPENDED"
    assert doc.restrict_after == "GRACE_EXPIRED_AND_INVOICE_OPEN"
    assert doc.recover_on == "INVOICE_PAID_RECEIPT"
    assert doc.recover_with_remaining_debt is False
    assert doc.cancel_after == "MANUAL_OR_POLICY_TERMINAL"
    assert doc.cancel_after_restricted == timedelta(days=30)
    assert doc.template_generation == 3
    assert doc.exception_requires == ("owner", "reason", "ticket")
    assert doc.exception_max_duration == timedelta(days=14)
    assert (doc.clock, doc.mode) == ("DATABASE", "ENFORCE")
    assert (doc.rollout_percent, doc.rollout_cohort) == (100, "default")
    assert doc.canonical["schema"] == SCHEMA_ID
    assert len(doc.digest()) == 64


def test_document_is_frozen() -> None:
    doc = load_policy(SPEC_EXAMPLE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        doc.mode = "SHADOW"  # type: ignore[misc]


def test_defaults_for_a_minimal_document() -> None:
    doc = validate_policy({
        "schema": SCHEMA_ID, "policy": "minimal@1", "provider": {"name": "stripe", "account": "acct_demo"},
        "applies_to": {"prices": ["price_x"]}, "retryAuthority": "PAYMENT_PROVIDER", "maxAttempts": 3,
        "grace": {"duration": "P7D", "profile": "LIMITED"}, "restricted_profile": "SUSPENDED",
        "exceptions": {"max_duration": "P14D"},
    })
    assert doc.cohort == "default"
    assert doc.invoice_status_mapping == DEFAULT_STATUSES
    assert doc.dispute_lost == "BLOCKING"
    assert doc.failure_classes == {}
    assert doc.grace_starts == "FIRST_FAILURE"
    assert doc.cancel_after == "MANUAL_ONLY"
    assert doc.cancel_after_restricted is None
    assert (doc.template_generation, doc.reminders_before_grace_end) == (1, ())
    assert doc.exception_requires == ("owner", "reason", "ticket")
    assert (doc.clock, doc.mode) == ("DATABASE", "SHADOW")
    assert (doc.rollout_percent, doc.rollout_cohort) == (100, "default")


def test_equivalent_spellings_have_one_digest() -> None:
    base = load_policy(SPEC_EXAMPLE)
    doc = spec_doc()
    for camel, snake in [("retryAuthority", "retry_authority"), ("maxAttempts", "max_attempts"),
                         ("restrictAfter", "restrict_after"), ("recoverOn", "recover_on"),
                         ("cancelAfter", "cancel_after")]:
        doc[snake] = doc.pop(camel)
    doc["grace"]["duration"] = "P1W"
    doc["notifications"]["reminders_before_grace_end"] = ["PT24H", "P3D"]
    doc["applies_to"]["prices"].reverse()
    doc["invoice_status_mapping"].pop("open")  # BLOCKING is the default
    reordered = dict(reversed(list(doc.items())))
    assert validate_policy(reordered).digest() == base.digest()
    assert load_policy(SPEC_EXAMPLE.replace("P30D", "P31D")).digest() != base.digest()


@pytest.mark.parametrize(
    "grace",
    ["NO_GRACE", {"starts": "NO_GRACE"}, {"starts": "NO_GRACE", "profile": "SUSPENDED"}],
)
def test_no_grace_spellings_are_equivalent(grace: Any) -> None:
    doc = validate_policy(spec_doc(grace=grace, notifications={"template_generation": 3}))
    assert (doc.has_grace, doc.grace_starts, doc.grace_duration) == (False, "NO_GRACE", timedelta(0))
    assert doc.grace_profile == "SUSPENDED"
    assert doc.canonical["grace"] == {"starts": "NO_GRACE", "duration": None, "profile": "SUSPENDED"}


def test_failure_class_for() -> None:
    doc = validate_policy(spec_doc(failure_classes={"insufficient_funds": "CUSTOMER_ACTION", "Do_Not_Honor":
                                                    "TRANSIENT_UNKNOWN"}))
    assert doc.failure_class_for("insufficient_funds") == "CUSTOMER_ACTION"  # the policy first
    assert doc.failure_class_for("do_not_honor") == "TRANSIENT_UNKNOWN"  # codes are case-insensitive
    assert doc.failure_class_for("stolen_card") == "NON_RETRYABLE"  # then SPEC §8
    assert doc.failure_class_for("authentication_required") == "CUSTOMER_ACTION"
    assert doc.failure_class_for("something_new") == "RETRYABLE"
    assert doc.failure_class_for(None) == "RETRYABLE"
    assert doc.failure_class_for("") == "RETRYABLE"
    assert set(doc.failure_classes.values()) <= set(FAILURE_CLASSES)


def test_default_policy_may_have_no_prices() -> None:
    doc = validate_policy(spec_doc(default=True, applies_to={"prices": []}))
    assert doc.is_default
    assert doc.prices == ()
    assert validate_policy(spec_doc(default=True, applies_to=None)).prices == ()


def test_snake_case_spellings_are_accepted() -> None:
    doc = spec_doc(retryAuthority=None, maxAttempts=None)
    doc.update(retry_authority="LOCAL", max_attempts=2, retry_intervals=["PT10S"])
    policy = validate_policy(doc)
    assert (policy.retry_authority, policy.max_attempts, policy.retry_intervals) == (
        "LOCAL", 2, (timedelta(seconds=10),))


def test_null_counts_as_absent() -> None:
    assert validate_policy(spec_doc(mode=None)).mode == "SHADOW"
    doc = spec_doc()
    doc["mode"] = None
    assert validate_policy(doc).mode == "SHADOW"


def test_fewer_local_intervals_than_retries_is_allowed() -> None:
    assert validate_policy(local_doc(retry_intervals=["PT15M"])).retry_intervals == (timedelta(minutes=15),)


# --- one message per fault ------------------------------------------------------------------


def test_every_fault_is_collected_in_document_order() -> None:
    doc = spec_doc(schema="subscription.dunningPolicy.v2", mode="FAST", colour="red")
    doc["grace"].pop("duration")
    with pytest.raises(PolicyValidationError) as caught:
        validate_policy(doc)
    assert caught.value.errors == [
        "colour: unknown field",
        "schema: must be subscription.dunningPolicy.v1, got 'subscription.dunningPolicy.v2'",
        "grace.duration: required unless grace is NO_GRACE",
        "mode: unknown mode 'FAST'; expected SHADOW, NOTIFY_ONLY or ENFORCE",
    ]
    assert str(caught.value) == "\n".join(caught.value.errors)
    assert isinstance(caught.value, ValueError)


def test_validate_policy_refuses_a_non_mapping() -> None:
    expected = ["document: top level must be a mapping, got list"]
    assert errors_of(["schema"]) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"retry_interval": ["PT1H"]}, "retry_interval: unknown field (did you mean 'retry_intervals'?)"),
        ({"retryauthority": "LOCAL"}, "retryauthority: unknown field (did you mean 'retryAuthority'?)"),
        ({"colour": "red"}, "colour: unknown field"),
        ({"provider": {"name": "stripe", "acount": "acct_123"}},
         "provider.acount: unknown field (did you mean 'account'?)"),
        ({"grace": {"duration": "P7D", "profile": "LIMITED", "start": "FIRST_FAILURE"}},
         "grace.start: unknown field (did you mean 'starts'?)"),
        ({"rollout": {"percent": 5, "cohort": "default", "region": "eu"}}, "rollout.region: unknown field"),
    ],
)
def test_unknown_fields(changes: dict[str, Any], expected: str) -> None:
    doc = spec_doc(**changes)
    if "provider" in changes:
        doc["provider"]["account"] = "acct_123"
    assert errors_of(doc) == [expected]


@pytest.mark.parametrize("schema", ["subscription.dunningPolicy.v2", "dunningPolicy.v1", 1])
def test_wrong_schema(schema: Any) -> None:
    expected = f"schema: must be subscription.dunningPolicy.v1, got {schema!r}"
    assert errors_of(spec_doc(schema=schema)) == [expected]


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("schema", ["schema: required; expected subscription.dunningPolicy.v1"]),
        ("policy", ["policy: required; expected name@version, e.g. standard-monthly@6"]),
        ("provider", ["provider.name: required", "provider.account: required"]),
        ("retryAuthority", ["retryAuthority: required; exactly one of PAYMENT_PROVIDER or LOCAL"]),
        ("maxAttempts", ["maxAttempts: required"]),
        ("grace", ["grace: required; NO_GRACE or a mapping with starts, duration and profile"]),
        ("restricted_profile", ["restricted_profile: required; the profile after grace, e.g. SUSPENDED"]),
        ("exceptions", ["exceptions.max_duration: required; every exception must expire, e.g. P14D"]),
    ],
)
def test_missing_required_fields(key: str, expected: list[str]) -> None:
    assert errors_of(spec_doc(**{key: None})) == expected


@pytest.mark.parametrize(
    ("section", "key", "expected"),
    [
        ("provider", "name", "provider.name: required"),
        ("provider", "account", "provider.account: required"),
        ("exceptions", "max_duration",
         "exceptions.max_duration: required; every exception must expire, e.g. P14D"),
    ],
)
def test_missing_required_nested_fields(section: str, key: str, expected: str) -> None:
    doc = spec_doc()
    doc[section].pop(key)
    assert errors_of(doc) == [expected]


@pytest.mark.parametrize(
    ("identity", "expected"),
    [
        ("standard-monthly", "policy: must be name@version, e.g. standard-monthly@6; got 'standard-monthly'"),
        (6, "policy: must be name@version, e.g. standard-monthly@6; got 6"),
        ("Standard-Monthly@6", "policy: name 'Standard-Monthly' must be lowercase letters, digits and "
                               "hyphens, not starting with a hyphen"),
        ("-monthly@6", "policy: name '-monthly' must be lowercase letters, digits and hyphens, "
                       "not starting with a hyphen"),
        ("standard-monthly@0", "policy: version '0' must be a positive integer without leading zeros"),
        ("standard-monthly@v6", "policy: version 'v6' must be a positive integer without leading zeros"),
        ("standard-monthly@06", "policy: version '06' must be a positive integer without leading zeros"),
        ("standard-monthly@", "policy: version '' must be a positive integer without leading zeros"),
    ],
)
def test_malformed_identity(identity: Any, expected: str) -> None:
    assert errors_of(spec_doc(policy=identity)) == [expected]


def test_two_retry_authorities_as_a_list() -> None:
    assert errors_of(spec_doc(retryAuthority=["PAYMENT_PROVIDER", "LOCAL"])) == [
        "retryAuthority: more than one retry authority given (PAYMENT_PROVIDER, LOCAL); "
        "a policy has exactly one"
    ]


def test_a_single_retry_authority_in_a_list() -> None:
    assert errors_of(spec_doc(retryAuthority=["LOCAL"])) == [
        "retryAuthority: must be a single value (PAYMENT_PROVIDER or LOCAL), not a list"
    ]


def test_two_retry_authorities_in_both_spellings() -> None:
    assert errors_of(spec_doc(retry_authority="LOCAL")) == [
        "retryAuthority: given twice as retryAuthority and retry_authority; "
        "a policy has exactly one retry authority"
    ]


@pytest.mark.parametrize(
    ("snake", "camel", "value"),
    [
        ("max_attempts", "maxAttempts", 4),
        ("restrict_after", "restrictAfter", "GRACE_EXPIRED_AND_INVOICE_OPEN"),
        ("recover_on", "recoverOn", "INVOICE_PAID_RECEIPT"),
        ("cancel_after", "cancelAfter", "MANUAL_OR_POLICY_TERMINAL"),
    ],
)
def test_a_key_in_both_spellings(snake: str, camel: str, value: Any) -> None:
    assert errors_of(spec_doc(**{snake: value})) == [f"{camel}: given twice as {camel} and {snake}"]


def test_unknown_retry_authority() -> None:
    assert errors_of(spec_doc(retryAuthority="STRIPE")) == [
        "retryAuthority: unknown retry authority 'STRIPE'; expected PAYMENT_PROVIDER or LOCAL"
    ]
    assert errors_of(spec_doc(retryAuthority="local")) == [
        "retryAuthority: unknown retry authority 'local'; expected PAYMENT_PROVIDER or LOCAL "
        "(did you mean 'LOCAL'?)"
    ]


def test_local_without_retry_intervals() -> None:
    expected = ["retry_intervals: required when retryAuthority is LOCAL, e.g. [PT15M, PT6H, P1D]"]
    assert errors_of(local_doc(retry_intervals=None)) == expected
    assert errors_of(local_doc(retry_intervals=[])) == expected


def test_provider_with_retry_intervals() -> None:
    assert errors_of(spec_doc(retry_intervals=["PT15M", "PT6H", "P1D"])) == [
        "retry_intervals: PROVIDER schedules are evidence; retry_intervals is LOCAL only"
    ]


def test_more_retry_intervals_than_attempts_allow() -> None:
    assert errors_of(local_doc(maxAttempts=3)) == [
        "retry_intervals: 3 intervals but maxAttempts 3 allows at most 2 retries after the first attempt"
    ]
    assert errors_of(local_doc(maxAttempts=1, retry_intervals=["PT1H"])) == [
        "retry_intervals: 1 intervals but maxAttempts 1 allows at most 0 retries after the first attempt"
    ]


def test_retry_intervals_must_be_positive_distinct_durations() -> None:
    assert errors_of(local_doc(retry_intervals=["PT15M", "PT0S"])) == [
        "retry_intervals[1]: must be longer than zero, got PT0S"
    ]
    assert errors_of(local_doc(retry_intervals=["PT15M", "PT15M"])) == [
        "retry_intervals[1]: PT15M is listed twice"
    ]
    assert errors_of(local_doc(retry_intervals="PT15M")) == [
        "retry_intervals: must be a list of durations, got 'PT15M'"
    ]


@pytest.mark.parametrize("attempts", [0, -1, True, False, "4", 1.5])
def test_max_attempts_must_be_a_positive_integer(attempts: Any) -> None:
    shown = str(attempts).lower() if isinstance(attempts, bool) else repr(attempts)
    expected = f"maxAttempts: must be a positive integer, got {shown}"
    assert errors_of(spec_doc(maxAttempts=attempts)) == [expected]


def test_grace_without_duration() -> None:
    assert errors_of(spec_doc(grace={"starts": "FIRST_FAILURE", "profile": "LIMITED"})) == [
        "grace.duration: required unless grace is NO_GRACE"
    ]


def test_grace_of_zero_length() -> None:
    assert errors_of(spec_doc(grace={"duration": "PT0S", "profile": "LIMITED"})) == [
        "grace.duration: must be longer than zero, got PT0S"
    ]


def test_no_grace_with_a_duration() -> None:
    grace = {"starts": "NO_GRACE", "duration": "P7D", "profile": "SUSPENDED"}
    doc = spec_doc(grace=grace, notifications=None)
    assert errors_of(doc) == ["grace.duration: not allowed when grace is NO_GRACE"]


def test_grace_without_profile() -> None:
    assert errors_of(spec_doc(grace={"starts": "FIRST_FAILURE", "duration": "P7D"})) == [
        "grace.profile: required; the profile during grace, one of FULL, LIMITED, READ_EXPORT_NO_NEW_JOBS, "
        "SUSPENDED or REVOKED"
    ]


@pytest.mark.parametrize("grace", ["P7D", "no_grace", 7, ["P7D"]])
def test_grace_of_the_wrong_shape(grace: Any) -> None:
    shown = "true" if grace is True else repr(grace)
    assert errors_of(spec_doc(grace=grace)) == [
        f"grace: must be NO_GRACE or a mapping with starts, duration and profile; got {shown}"
    ]


def test_grace_starts_other_than_first_failure_or_no_grace() -> None:
    assert errors_of(spec_doc(grace={"starts": "INVOICE_DUE", "duration": "P7D", "profile": "LIMITED"})) == [
        "grace.starts: unknown grace start 'INVOICE_DUE'; expected FIRST_FAILURE or NO_GRACE"
    ]


def test_unknown_profiles() -> None:
    expected_choices = "expected FULL, LIMITED, READ_EXPORT_NO_NEW_JOBS, SUSPENDED or REVOKED"
    assert errors_of(spec_doc(grace={"duration": "P7D", "profile": "READ_ONLY"})) == [
        f"grace.profile: unknown profile 'READ_ONLY'; {expected_choices}"
    ]
    assert errors_of(spec_doc(restricted_profile="suspended")) == [
        f"restricted_profile: unknown profile 'suspended'; {expected_choices} (did you mean 'SUSPENDED'?)"
    ]
    assert errors_of(spec_doc(grace={"starts": "NO_GRACE", "profile": "BLOCKED"}, notifications=None)) == [
        f"grace.profile: unknown profile 'BLOCKED'; {expected_choices}"
    ]
    assert set(PROFILES) == {"FULL", "LIMITED", "READ_EXPORT_NO_NEW_JOBS", "SUSPENDED", "REVOKED"}


def test_restricted_profile_must_restrict() -> None:
    assert errors_of(spec_doc(restricted_profile="FULL", grace={"duration": "P7D", "profile": "FULL"})) == [
        "restricted_profile: FULL restricts nothing; choose a restrictive profile"
    ]
    assert errors_of(spec_doc(restricted_profile="LIMITED")) == [
        "restricted_profile: LIMITED is looser than the grace profile READ_EXPORT_NO_NEW_JOBS"
    ]


@pytest.mark.parametrize("reminder", ["P8D", "P7D"])
def test_reminder_not_shorter_than_grace(reminder: str) -> None:
    doc = spec_doc(notifications={"template_generation": 3, "reminders_before_grace_end": [reminder, "P1D"]})
    assert errors_of(doc) == [
        f"notifications.reminders_before_grace_end[0]: reminder {reminder} before grace end falls at or "
        "before grace starts; it must be shorter than the grace duration P7D"
    ]


def test_reminders_with_no_grace() -> None:
    assert errors_of(spec_doc(grace="NO_GRACE")) == [
        "notifications.reminders_before_grace_end: not allowed when grace is NO_GRACE: "
        "there is no grace end to remind before"
    ]


def test_duplicate_reminders() -> None:
    doc = spec_doc(notifications={"reminders_before_grace_end": ["P1D", "PT24H"]})
    assert errors_of(doc) == ["notifications.reminders_before_grace_end[1]: P1D is listed twice"]


@pytest.mark.parametrize(
    ("changes", "path", "text"),
    [
        ({"grace": {"duration": "7 days", "profile": "LIMITED"}}, "grace.duration", "7 days"),
        ({"cancel_after_restricted": "P30"}, "cancel_after_restricted", "P30"),
        ({"exceptions": {"max_duration": "P2X"}}, "exceptions.max_duration", "P2X"),
        ({"notifications": {"reminders_before_grace_end": ["P3D", "1D"]}},
         "notifications.reminders_before_grace_end[1]", "1D"),
    ],
)
def test_invalid_iso_durations(changes: dict[str, Any], path: str, text: str) -> None:
    assert errors_of(spec_doc(**changes)) == [
        f"{path}: {text!r} is not an ISO-8601 duration (e.g. P7D, PT15M, PT10S, P1DT6H)"
    ]


def test_negative_and_non_string_durations() -> None:
    assert errors_of(spec_doc(cancel_after_restricted="-P30D")) == [
        "cancel_after_restricted: '-P30D' is negative; a duration must not be negative"
    ]
    assert errors_of(local_doc(retry_intervals=["PT15M", 900])) == [
        "retry_intervals[1]: must be an ISO-8601 duration such as P7D or PT15M, got 900"
    ]


def test_seconds_durations_are_valid() -> None:
    doc = validate_policy(local_doc(
        retry_intervals=["PT10S", "PT20S"],
        grace={"duration": "PT60S", "profile": "LIMITED"},
        notifications={"reminders_before_grace_end": ["PT30S", "PT10S"]},
        cancel_after_restricted="PT90S",
        exceptions={"max_duration": "PT120S"},
    ))
    assert doc.grace_duration == timedelta(seconds=60)
    assert doc.canonical["grace"]["duration"] == "PT1M"


@pytest.mark.parametrize(
    ("mapping", "expected"),
    [
        ({"open": "BLOCKING", "pending": "BLOCKING"},
         "invoice_status_mapping.pending: unknown invoice status; expected draft, open, paid, void or "
         "uncollectible"),
        ({"opn": "BLOCKING"},
         "invoice_status_mapping.opn: unknown invoice status; expected draft, open, paid, void or "
         "uncollectible (did you mean 'open'?)"),
        ({"open": "YES"}, "invoice_status_mapping.open: unknown value 'YES'; expected BLOCKING or CLOSED"),
        ({"open": True}, "invoice_status_mapping.open: unknown value true; expected BLOCKING or CLOSED"),
        ({"open": None}, "invoice_status_mapping.open: required; expected BLOCKING or CLOSED"),
        ({"paid": "BLOCKING"},
         "invoice_status_mapping.paid: cannot be BLOCKING: a paid invoice is never debt"),
    ],
)
def test_invoice_status_mapping_faults(mapping: dict[str, Any], expected: str) -> None:
    assert errors_of(spec_doc(invoice_status_mapping=mapping)) == [expected]


def test_invoice_status_mapping_overrides_defaults() -> None:
    doc = validate_policy(spec_doc(invoice_status_mapping={"uncollectible": "CLOSED"}))
    assert doc.invoice_status_mapping["uncollectible"] == "CLOSED"
    assert doc.invoice_status_mapping["open"] == "BLOCKING"
    assert errors_of(spec_doc(invoice_status_mapping=["open"])) == [
        "invoice_status_mapping: must be a mapping of invoice status to BLOCKING or CLOSED; got ['open']"
    ]


def test_dispute_lost_enum() -> None:
    assert errors_of(spec_doc(dispute_lost="OPEN")) == [
        "dispute_lost: unknown value 'OPEN'; expected BLOCKING or CLOSED"
    ]


def test_failure_classes_faults() -> None:
    choices = "RETRYABLE, TRANSIENT_UNKNOWN, CUSTOMER_ACTION or NON_RETRYABLE"
    assert errors_of(spec_doc(failure_classes={"expired_card": "HARD_DECLINE"})) == [
        f"failure_classes.expired_card: unknown failure class 'HARD_DECLINE'; expected {choices}"
    ]
    classes = {"stolen_card": "NON_RETRYABLE", "Stolen_Card": "RETRYABLE"}
    assert errors_of(spec_doc(failure_classes=classes)) == [
        "failure_classes.Stolen_Card: given twice (decline codes are compared case-insensitively)"
    ]


def test_failure_classes_take_provider_sub_codes_with_dots_and_upper_case() -> None:
    """Alipay's sub_code (ACQ.BALANCE_NOT_ENOUGH) is a decline code like Stripe's: stored lower
    case, looked up case-insensitively, and a second spelling of it is a fault."""
    spec = validate_policy(spec_doc(failure_classes={"ACQ.BALANCE_NOT_ENOUGH": "RETRYABLE",
                                                     "ACQ.AGREEMENT_INVALID": "CUSTOMER_ACTION"}))
    assert spec.failure_classes == {"acq.balance_not_enough": "RETRYABLE", "acq.agreement_invalid": "CUSTOMER_ACTION"}
    assert spec.failure_class_for("ACQ.AGREEMENT_INVALID") == "CUSTOMER_ACTION"
    classes = {"ACQ.SYSTEM_ERROR": "TRANSIENT_UNKNOWN", "acq.system_error": "RETRYABLE"}
    assert errors_of(spec_doc(failure_classes=classes)) == [
        "failure_classes.acq.system_error: given twice (decline codes are compared case-insensitively)"
    ]


def test_shipped_alipay_policy_validates() -> None:
    document = load_policy((POLICY_DIR / "alipay-monthly.yaml").read_text())
    assert document.identity == "alipay-monthly@1" and document.is_default
    assert (document.provider_name, document.provider_account) == ("alipay", "2021000000000001")
    assert document.retry_authority == "LOCAL" and document.max_attempts == 3
    assert [format_iso_duration(i) for i in document.retry_intervals] == ["PT6H", "P1D"]
    assert document.prices == ("alipay_monthly",)
    assert format_iso_duration(document.grace_duration) == "P7D"
    assert len(document.reminders_before_grace_end) >= 2
    assert document.mode == "ENFORCE"
    assert all(code.startswith("acq.") for code in document.failure_classes)


@pytest.mark.parametrize(("key", "value", "choices"), [
    ("mode", "LIVE", "SHADOW, NOTIFY_ONLY or ENFORCE"),
    ("clock", "WALL", "DATABASE or APPLICATION"),
])
def test_enums(key: str, value: str, choices: str) -> None:
    assert errors_of(spec_doc(**{key: value})) == [f"{key}: unknown {key} {value!r}; expected {choices}"]


def test_constant_fields() -> None:
    assert errors_of(spec_doc(restrictAfter="GRACE_EXPIRED")) == [
        "restrictAfter: unknown value 'GRACE_EXPIRED'; expected GRACE_EXPIRED_AND_INVOICE_OPEN"
    ]
    assert errors_of(spec_doc(recoverOn="WEBHOOK")) == [
        "recoverOn: unknown value 'WEBHOOK'; expected INVOICE_PAID_RECEIPT"
    ]
    assert errors_of(spec_doc(recover_with_remaining_debt="no")) == [
        "recover_with_remaining_debt: must be true or false, got 'no'"
    ]


@pytest.mark.parametrize(("percent", "shown"), [(150, "150"), (-1, "-1"), ("50", "'50'"), (True, "true"),
                                                 (12.5, "12.5")])
def test_rollout_percent(percent: Any, shown: str) -> None:
    assert errors_of(spec_doc(rollout={"percent": percent, "cohort": "default"})) == [
        f"rollout.percent: must be an integer from 0 to 100, got {shown}"
    ]


@pytest.mark.parametrize("percent", [0, 5, 100])
def test_rollout_percent_bounds_are_valid(percent: int) -> None:
    assert validate_policy(spec_doc(rollout={"percent": percent})).rollout_percent == percent


@pytest.mark.parametrize(
    ("requires", "expected"),
    [
        (["owner", "reason"], ["exceptions.requires: must include owner, reason and ticket; missing ticket"]),
        ([], ["exceptions.requires: must include owner, reason and ticket; missing owner, reason, ticket"]),
        (["owner", "reason", "ticket", "manager"],
         ["exceptions.requires: unknown requirement 'manager'; only owner, reason and ticket"]),
        ("owner", ["exceptions.requires: must be a list of requirements, got 'owner'"]),
    ],
)
def test_exception_requirements(requires: Any, expected: list[str]) -> None:
    assert errors_of(spec_doc(exceptions={"max_duration": "P14D", "requires": requires})) == expected


def test_exception_max_duration_zero() -> None:
    assert errors_of(spec_doc(exceptions={"max_duration": "PT0S"})) == [
        "exceptions.max_duration: must be longer than zero, got PT0S"
    ]


def test_prices_empty_while_not_default() -> None:
    expected = ["applies_to.prices: must list at least one price id unless the policy is default: true"]
    assert errors_of(spec_doc(applies_to={"prices": [], "cohort": "default"})) == expected
    assert errors_of(spec_doc(applies_to=None)) == expected
    assert errors_of(spec_doc(default=False, applies_to={"prices": []})) == expected


def test_prices_faults() -> None:
    assert errors_of(spec_doc(applies_to={"prices": ["price_a", "price_a"]})) == [
        "applies_to.prices[1]: 'price_a' is listed twice"
    ]
    assert errors_of(spec_doc(applies_to={"prices": ["price_a", ""]})) == [
        "applies_to.prices[1]: must be a non-empty string, got ''"
    ]
    assert errors_of(spec_doc(default="yes")) == ["default: must be true or false, got 'yes'"]


def test_cancel_after_policy_terminal_needs_a_delay() -> None:
    assert errors_of(spec_doc(cancel_after_restricted=None)) == [
        "cancel_after_restricted: required when cancelAfter is MANUAL_OR_POLICY_TERMINAL, e.g. P30D"
    ]


def test_manual_only_cancellation_takes_no_delay() -> None:
    assert errors_of(spec_doc(cancelAfter="MANUAL_ONLY")) == [
        "cancel_after_restricted: not allowed when cancelAfter is MANUAL_ONLY (the default); set "
        "cancelAfter: MANUAL_OR_POLICY_TERMINAL to cancel after this delay"
    ]
    assert errors_of(spec_doc(cancelAfter="SOMETIMES", cancel_after_restricted=None)) == [
        "cancelAfter: unknown value 'SOMETIMES'; expected MANUAL_OR_POLICY_TERMINAL or MANUAL_ONLY"
    ]


def test_sections_of_the_wrong_shape() -> None:
    assert errors_of(spec_doc(provider="stripe")) == [
        "provider: must be a mapping of name, account; got 'stripe'"
    ]
    assert errors_of(spec_doc(notifications={"template_generation": 0})) == [
        "notifications.template_generation: must be a positive integer, got 0"
    ]


def test_input_is_not_modified() -> None:
    doc = spec_doc()
    before = copy.deepcopy(doc)
    validate_policy(doc)
    assert doc == before


def test_hard_declines_can_never_be_made_retryable():
    import json as _json

    from tests.support.builders import policy_document

    doc = policy_document(failure_classes={"stolen_card": "RETRYABLE"})
    with pytest.raises(PolicyValidationError) as exc:
        load_policy(_json.dumps(doc))
    assert any("stolen_card is a hard decline" in e for e in exc.value.errors)
    spec = load_policy(_json.dumps(policy_document(failure_classes={})))
    for code in ("incorrect_number", "lost_card", "pickup_card", "stolen_card", "revocation_of_authorization",
                 "revocation_of_all_authorizations", "authentication_required", "highest_risk_level"):
        assert spec.failure_class_for(code) in ("CUSTOMER_ACTION", "NON_RETRYABLE"), code
    assert spec.failure_class_for("timeout") == "TRANSIENT_UNKNOWN"


# --- contract_access (the contract line, SPEC §7) -----------------------------------------------------


def test_contract_access_defaults_and_keeps_older_documents_digest() -> None:
    doc = load_policy(SPEC_EXAMPLE)
    assert "contract_access" not in doc.canonical, "a document that does not state it keeps its digest"
    assert doc.contract_access["canceled"] == "REVOKED" and doc.contract_access["active"] == "FULL"
    stated = load_policy(SPEC_EXAMPLE + "contract_access: {paused: SUSPENDED}\n")
    assert stated.contract_access["paused"] == "SUSPENDED" and stated.contract_access["canceled"] == "REVOKED"
    assert stated.digest() != doc.digest()


def test_contract_access_faults_are_named() -> None:
    with pytest.raises(PolicyValidationError) as caught:
        load_policy(SPEC_EXAMPLE + "contract_access: {cancelled: REVOKED, canceled: FULL, paused: OPEN}\n")
    errors = caught.value.errors
    assert any(e.startswith("contract_access.cancelled: unknown contract state") and "'canceled'" in e
               for e in errors), errors
    assert any(e.startswith("contract_access.canceled: an ended contract cannot keep FULL") for e in errors)
    assert any(e.startswith("contract_access.paused: unknown profile") for e in errors)
