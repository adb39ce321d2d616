"""Parse and validate `subscription.dunningPolicy.v1` documents (SPEC §4). Pure Python: no Django.

``load_policy(text)`` turns YAML or JSON text into a frozen :class:`PolicyDocument`, or raises
:class:`PolicyValidationError` listing every fault, one message each, each naming its field path.

* ``retryAuthority``, ``maxAttempts``, ``restrictAfter``, ``recoverOn`` and ``cancelAfter`` are
  accepted in camelCase or snake_case; the canonical document spells every key in snake_case.
* A field whose value is ``null`` counts as absent, so the canonical document loads again.
* Defaults: ``default: false``, ``applies_to.cohort: default``, ``DEFAULT_INVOICE_STATUS_MAPPING``,
  ``dispute_lost: BLOCKING``, ``grace.starts: FIRST_FAILURE`` (a NO_GRACE policy's grace profile is
  its restricted profile), ``restrictAfter: GRACE_EXPIRED_AND_INVOICE_OPEN``,
  ``recoverOn: INVOICE_PAID_RECEIPT``, ``recover_with_remaining_debt: false``,
  ``cancelAfter: MANUAL_ONLY`` (nothing cancels on a timer unless the policy says so),
  ``notifications: {template_generation: 1, reminders_before_grace_end: []}``,
  ``exceptions.requires: [owner, reason, ticket]``, ``clock: DATABASE``, ``mode: SHADOW`` (a policy
  enforces only when it says so), ``rollout: {percent: 100, cohort: default}`` and
  ``contract_access: DEFAULT_CONTRACT_ACCESS`` (stated in the canonical document only when given,
  so documents published before the contract line keep their digest).
* ``PROFILES`` runs from least to most restrictive; a restricted profile may not be FULL nor
  looser than the grace profile.
* ``retry_intervals[i]`` is the wait before local attempt ``i + 2``; when fewer than
  ``maxAttempts - 1`` are given, the last one repeats.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import yaml

from dunning.policy.checks import _Checker
from dunning.policy.durations import format_iso_duration, parse_iso_duration
from dunning.policy.low_risk import LowRisk
from dunning.policy.vocabulary import (
    BUILTIN_FAILURE_CLASSES,
    DEFAULT_CONTRACT_ACCESS,
    DEFAULT_INVOICE_STATUS_MAPPING,
    FAILURE_CLASSES,
    HARD_DECLINES,
    INVOICE_STATUSES,
    NO_RETRY,
    PROFILES,
    SCHEMA_ID,
)

__all__ = [
    "BUILTIN_FAILURE_CLASSES", "DEFAULT_INVOICE_STATUS_MAPPING", "FAILURE_CLASSES", "HARD_DECLINES", "INVOICE_STATUSES",
    "NO_RETRY", "PROFILES", "SCHEMA_ID", "PolicyDocument", "PolicyValidationError", "format_iso_duration",
    "load_policy", "parse_iso_duration", "parse_policy_text", "validate_policy",
]


class PolicyValidationError(ValueError):
    """Every fault found in a policy document; ``str()`` gives one message per line."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = list(errors)
        super().__init__("\n".join(self.errors))


@dataclass(frozen=True)
class PolicyDocument:
    """A validated, normalised policy. ``canonical`` is what gets stored and digested."""

    name: str
    version: int
    identity: str
    provider_name: str
    provider_account: str
    prices: tuple[str, ...]
    cohort: str
    is_default: bool
    invoice_status_mapping: dict[str, str]
    dispute_lost: str
    retry_authority: str
    max_attempts: int
    retry_intervals: tuple[timedelta, ...]
    failure_classes: dict[str, str]
    has_grace: bool
    grace_starts: str
    grace_duration: timedelta
    grace_profile: str
    restrict_after: str
    restricted_profile: str
    recover_on: str
    recover_with_remaining_debt: bool
    cancel_after: str
    cancel_after_restricted: timedelta | None
    template_generation: int
    reminders_before_grace_end: tuple[timedelta, ...]
    exception_max_duration: timedelta
    exception_requires: tuple[str, ...]
    clock: str
    mode: str
    rollout_percent: int
    rollout_cohort: str
    canonical: dict[str, Any]
    # Who may join a partial rollout (None: everyone in the bucket); see dunning.policy.low_risk.
    rollout_low_risk: LowRisk | None = None
    # Contract state → the most access it allows (DEFAULT_CONTRACT_ACCESS unless the policy says).
    contract_access: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_CONTRACT_ACCESS))

    def __hash__(self) -> int:
        return hash(self.digest())

    def digest(self) -> str:
        """SHA-256 hex of the canonical document (sorted keys, compact separators)."""
        body = json.dumps(self.canonical, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(body.encode()).hexdigest()

    def failure_class_for(self, decline_code: str | None) -> str:
        """The policy's class for a decline code, then SPEC §8's, else RETRYABLE (also for None)."""
        if not decline_code:
            return "RETRYABLE"
        code = decline_code.strip().lower()
        chosen = self.failure_classes.get(code) or BUILTIN_FAILURE_CLASSES.get(code, "RETRYABLE")
        if code in HARD_DECLINES and chosen not in NO_RETRY:
            return HARD_DECLINES[code]
        return chosen


def parse_policy_text(text: str) -> dict[str, Any]:
    """Parse YAML or JSON text into the raw mapping; syntax faults raise PolicyValidationError."""
    data: Any = None
    stripped = text.strip() if isinstance(text, str) else ""
    if not stripped:
        raise PolicyValidationError(["document: empty; expected a YAML or JSON policy mapping"])
    json_error = None
    if stripped[0] in "{[":
        try:
            data = json.loads(stripped, object_pairs_hook=_json_object)
        except _DuplicateKey as exc:
            raise PolicyValidationError([f"document: {exc}"]) from None
        except json.JSONDecodeError as exc:
            json_error = f"document: not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
    if data is None:
        try:
            data = yaml.load(stripped, Loader=_StrictLoader)  # a SafeLoader subclass
        except _DuplicateKey as exc:
            raise PolicyValidationError([f"document: {exc}"]) from None
        except yaml.YAMLError as exc:
            message = json_error or f"document: not valid YAML: {_yaml_problem(exc)}"
            raise PolicyValidationError([message]) from None
    if not isinstance(data, dict):
        kind = "nothing" if data is None else type(data).__name__
        raise PolicyValidationError([f"document: top level must be a mapping of policy fields, got {kind}"])
    return data


def validate_policy(data: dict[str, Any]) -> PolicyDocument:
    """Validate a raw mapping; collects every fault, then raises PolicyValidationError if any."""
    if not isinstance(data, dict):
        raise PolicyValidationError([f"document: top level must be a mapping, got {type(data).__name__}"])
    checker = _Checker(data)
    canonical = checker.canonical()
    if checker.errors:
        raise PolicyValidationError(checker.errors)
    return _document(canonical)


def load_policy(text: str) -> PolicyDocument:
    """Parse YAML/JSON text and validate it."""
    return validate_policy(parse_policy_text(text))


def _document(c: dict[str, Any]) -> PolicyDocument:
    """The dataclass view of a canonical document, so fields and canonical can never disagree."""
    grace, notes, exceptions = c["grace"], c["notifications"], c["exceptions"]
    cancel_delay = c["cancel_after_restricted"]
    name, _, version = c["policy"].partition("@")
    return PolicyDocument(
        name=name, version=int(version), identity=c["policy"], provider_name=c["provider"]["name"],
        provider_account=c["provider"]["account"], prices=tuple(c["applies_to"]["prices"]),
        cohort=c["applies_to"]["cohort"], is_default=c["default"],
        invoice_status_mapping=dict(c["invoice_status_mapping"]), dispute_lost=c["dispute_lost"],
        retry_authority=c["retry_authority"], max_attempts=c["max_attempts"],
        retry_intervals=tuple(parse_iso_duration(i) for i in c["retry_intervals"]),
        failure_classes=dict(c["failure_classes"]), has_grace=grace["starts"] != "NO_GRACE",
        grace_starts=grace["starts"], grace_duration=parse_iso_duration(grace["duration"] or "PT0S"),
        grace_profile=grace["profile"], restrict_after=c["restrict_after"],
        restricted_profile=c["restricted_profile"], recover_on=c["recover_on"],
        recover_with_remaining_debt=c["recover_with_remaining_debt"], cancel_after=c["cancel_after"],
        cancel_after_restricted=parse_iso_duration(cancel_delay) if cancel_delay else None,
        template_generation=notes["template_generation"],
        reminders_before_grace_end=tuple(parse_iso_duration(r) for r in notes["reminders_before_grace_end"]),
        exception_max_duration=parse_iso_duration(exceptions["max_duration"]),
        exception_requires=tuple(exceptions["requires"]), clock=c["clock"], mode=c["mode"],
        rollout_percent=c["rollout"]["percent"], rollout_cohort=c["rollout"]["cohort"], canonical=c,
        contract_access=dict(c.get("contract_access") or DEFAULT_CONTRACT_ACCESS),
        rollout_low_risk=LowRisk.of(c["rollout"].get("low_risk")),
    )


class _DuplicateKey(ValueError):
    pass


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(f"field {key!r} is given twice")
        result[key] = value
    return result


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping instead of keeping the last."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, str | int | float) and key in seen:
                line, column = key_node.start_mark.line + 1, key_node.start_mark.column + 1
                raise _DuplicateKey(f"field {key!r} is given twice (line {line}, column {column})")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"{exc.problem} (line {mark.line + 1}, column {mark.column + 1})"
    return str(exc)
