"""Field-by-field validation of a raw policy mapping: every fault is collected, one message each,
naming its field path (SPEC §4). Used by `dunning.policy.document.validate_policy`."""

from __future__ import annotations

import difflib
from datetime import timedelta
from typing import Any

from dunning.policy.durations import format_iso_duration, parse_iso_duration
from dunning.policy.low_risk import check_low_risk
from dunning.policy.vocabulary import (
    ACCEPTED_KEYS,
    CAMEL_CASE_KEYS,
    CANCEL_AFTER,
    CLOCKS,
    CONTRACT_STATES,
    DEBT,
    DEFAULT_CONTRACT_ACCESS,
    DEFAULT_INVOICE_STATUS_MAPPING,
    ENDED_CONTRACT_STATES,
    EXCEPTION_REQUIREMENTS,
    FAILURE_CLASSES,
    GRACE_STARTS,
    HARD_DECLINES,
    IDENTITY_NAME,
    IDENTITY_VERSION,
    INVOICE_STATUSES,
    MODES,
    NO_RETRY,
    PROFILES,
    REMINDERS_FIELD,
    RETRY_AUTHORITIES,
    SCHEMA_ID,
    SNAKE_CASE_KEYS,
    TOP_LEVEL_KEYS,
)


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def _one_of(choices: tuple[str, ...]) -> str:
    return " or ".join([", ".join(choices[:-1]), choices[-1]] if len(choices) > 1 else choices)


def _hint(word: Any, candidates: tuple[str, ...]) -> str:
    if not isinstance(word, str):
        return ""
    lowered = {candidate.lower(): candidate for candidate in candidates}
    match = difflib.get_close_matches(word.lower(), list(lowered), n=1, cutoff=0.75)
    return f" (did you mean {lowered[match[0]]!r}?)" if match else ""


class _Checker:
    """Reads one raw document, collecting one message per fault; ``canonical`` gives the normal form."""

    def __init__(self, data: dict[Any, Any]) -> None:
        self.errors: list[str] = []
        self.spelled: dict[str, str] = {}
        self.bad: set[str] = set()
        self.top: dict[str, Any] = {}
        for key, value in data.items():
            canon = SNAKE_CASE_KEYS.get(key, key) if isinstance(key, str) else key
            if canon not in TOP_LEVEL_KEYS:
                self.fault(str(key), "unknown field" + _hint(key, ACCEPTED_KEYS))
            elif canon in self.spelled:
                also = "; a policy has exactly one retry authority" if canon == "retry_authority" else ""
                self.fault(CAMEL_CASE_KEYS[canon], f"given twice as {self.spelled[canon]} and {key}{also}")
                self.bad.add(canon)
                self.top.pop(canon, None)
            else:
                self.spelled[canon] = key
                if value is not None:
                    self.top[canon] = value

    def fault(self, path: str, message: str) -> None:
        self.errors.append(f"{path}: {message}")

    def name(self, key: str) -> str:
        return self.spelled.get(key, CAMEL_CASE_KEYS.get(key, key))

    def field(self, key: str, required: str = "", default: Any = None) -> Any:
        """A top-level value; ``default`` when absent; None when absent or already reported."""
        if key in self.top:
            return self.top[key]
        if required and key not in self.bad:
            self.fault(self.name(key), required)
        return None if key in self.bad else default

    def section(self, key: str, fields: tuple[str, ...] = (), what: str = "") -> dict[Any, Any] | None:
        """A nested mapping ({} when absent, None when not a mapping); ``fields`` limits its keys."""
        value = self.field(key, default={})
        if value is None or not isinstance(value, dict):
            if value is not None:
                self.fault(key, f"must be a mapping of {what or ', '.join(fields)}; got {_show(value)}")
            return None
        if not fields:
            return value
        for sub in value:
            if sub not in fields:
                self.fault(f"{key}.{sub}", "unknown field" + _hint(sub, fields))
        return {sub: v for sub, v in value.items() if sub in fields and v is not None}

    def choice(self, path: str, value: Any, choices: tuple[str, ...], what: str, required: str = "") -> Any:
        if value is None:
            if required:
                self.fault(path, required)
        elif isinstance(value, str) and value in choices:
            return value
        else:
            hint = _hint(value, choices)
            self.fault(path, f"unknown {what} {_show(value)}; expected {_one_of(choices)}{hint}")
        return None

    def text(self, path: str, value: Any, required: str = "") -> str | None:
        if isinstance(value, str) and value.strip():
            return value.strip()
        if value is not None:
            self.fault(path, f"must be a non-empty string, got {_show(value)}")
        elif required:
            self.fault(path, required)
        return None

    def integer(self, path: str, value: Any, low: int, high: int | None, what: str) -> int | None:
        if value is None:
            return None
        in_range = isinstance(value, int) and low <= value and (high is None or value <= high)
        if in_range and not isinstance(value, bool):
            return value
        self.fault(path, f"must be {what}, got {_show(value)}")
        return None

    def boolean(self, path: str, value: Any) -> bool | None:
        if value is None or isinstance(value, bool):
            return value
        self.fault(path, f"must be true or false, got {_show(value)}")
        return None

    def duration(self, path: str, value: Any, required: str = "") -> timedelta | None:
        if value is None:
            if required:
                self.fault(path, required)
            return None
        if not isinstance(value, str):
            self.fault(path, f"must be an ISO-8601 duration such as P7D or PT15M, got {_show(value)}")
            return None
        try:
            result = parse_iso_duration(value)
        except ValueError as exc:
            self.fault(path, str(exc))
            return None
        if result > timedelta(0):
            return result
        self.fault(path, f"must be longer than zero, got {value}")
        return None

    def items(self, path: str, value: Any, what: str, parse: Any) -> list[Any] | None:
        """A list whose elements each go through ``parse``; None if it or any element is at fault."""
        if not isinstance(value, list):
            self.fault(path, f"must be a list of {what}, got {_show(value)}")
            return None
        result = [parse(f"{path}[{i}]", v, "must not be empty") for i, v in enumerate(value)]
        for i, item in enumerate(result):
            if item is not None and item in result[:i]:
                shown = format_iso_duration(item) if isinstance(item, timedelta) else repr(item)
                self.fault(f"{path}[{i}]", f"{shown} is listed twice")
        return None if None in result else result

    def canonical(self) -> dict[str, Any]:
        """The normalised document, checked in document order; meaningful only without faults.
        Each part checks its fields (so faults come out in this order) and gives its keys."""
        document = self.header_part()
        document["invoice_status_mapping"] = self.invoice_statuses()
        document["dispute_lost"] = self.choice("dispute_lost", self.field("dispute_lost", default="BLOCKING"), DEBT,
                                               "value")
        document.update(self.retry_part())
        access, grace_starts, grace_duration = self.access_part()
        document.update(access)
        document.update(self.cancellation_part())
        document["notifications"] = self.notifications_part(grace_starts, grace_duration)
        document["exceptions"] = self.exceptions_part()
        document.update(self.operation_part())
        contract_access = self.contract_access()
        if contract_access is not None:
            # Only when stated: documents published before the contract line keep their digest.
            document["contract_access"] = contract_access
        return document

    def header_part(self) -> dict[str, Any]:
        """schema, policy, default, provider, applies_to."""
        schema = self.field("schema", required=f"required; expected {SCHEMA_ID}")
        if schema is not None and schema != SCHEMA_ID:
            self.fault("schema", f"must be {SCHEMA_ID}, got {_show(schema)}")
        identity = self.identity()
        is_default = self.boolean("default", self.field("default", default=False))
        provider = self.section("provider", ("name", "account"))
        needed = "required" if provider is not None else ""
        provider_name = self.text("provider.name", (provider or {}).get("name"), needed)
        account = self.text("provider.account", (provider or {}).get("account"), needed)
        applies = self.section("applies_to", ("prices", "cohort")) or {}
        prices = self.items("applies_to.prices", applies.get("prices", []), "price ids", self.text)
        if prices == [] and is_default is False:
            self.fault("applies_to.prices", "must list at least one price id unless the policy is "
                       "default: true")
        cohort = self.text("applies_to.cohort", applies.get("cohort", "default"))
        return {
            "schema": SCHEMA_ID, "policy": identity, "default": is_default,
            "provider": {"name": provider_name, "account": account},
            "applies_to": {"prices": sorted(prices or []), "cohort": cohort},
        }

    def retry_part(self) -> dict[str, Any]:
        """retry_authority, max_attempts, retry_intervals, failure_classes."""
        authority, attempts, intervals = self.retries()
        failure_classes = self.failure_classes()
        return {
            "retry_authority": authority, "max_attempts": attempts,
            "retry_intervals": [format_iso_duration(i) for i in intervals or []], "failure_classes": failure_classes,
        }

    def access_part(self) -> tuple[dict[str, Any], str | None, timedelta | None]:
        """grace, restrict_after, restricted_profile, recover_on, recover_with_remaining_debt; with
        the grace's start and duration, which the reminders are checked against."""
        restricted = self.choice("restricted_profile", self.field("restricted_profile"), PROFILES, "profile",
                                 required="required; the profile after grace, e.g. SUSPENDED")
        if restricted == "FULL":
            self.fault("restricted_profile", "FULL restricts nothing; choose a restrictive profile")
        starts, grace_duration, grace_profile = self.grace(restricted)
        if restricted and grace_profile and PROFILES.index(restricted) < PROFILES.index(grace_profile):
            self.fault("restricted_profile", f"{restricted} is looser than the grace profile {grace_profile}")
        restrict_after = self.constant("restrict_after", "GRACE_EXPIRED_AND_INVOICE_OPEN")
        recover_on = self.constant("recover_on", "INVOICE_PAID_RECEIPT")
        remaining_debt = self.field("recover_with_remaining_debt", default=False)
        remaining_debt = self.boolean("recover_with_remaining_debt", remaining_debt)
        access = {
            "grace": {"starts": starts, "duration": format_iso_duration(grace_duration) if grace_duration else None,
                      "profile": grace_profile},
            "restrict_after": restrict_after, "restricted_profile": restricted, "recover_on": recover_on,
            "recover_with_remaining_debt": remaining_debt,
        }
        return access, starts, grace_duration

    def cancellation_part(self) -> dict[str, Any]:
        """cancel_after, cancel_after_restricted."""
        cancel_after, cancel_delay = self.cancellation()
        return {"cancel_after": cancel_after,
                "cancel_after_restricted": format_iso_duration(cancel_delay) if cancel_delay else None}

    def notifications_part(self, grace_starts: str | None, grace_duration: timedelta | None) -> dict[str, Any]:
        notes = self.section("notifications", ("template_generation", "reminders_before_grace_end")) or {}
        template = self.integer("notifications.template_generation", notes.get("template_generation", 1),
                                1, None, "a positive integer")
        reminders = self.items(REMINDERS_FIELD, notes.get("reminders_before_grace_end", []), "durations",
                               self.duration)
        self.check_reminders(reminders, grace_starts, grace_duration)
        return {"template_generation": template, "reminders_before_grace_end": [
            format_iso_duration(r) for r in sorted(reminders or [], reverse=True)]}

    def exceptions_part(self) -> dict[str, Any]:
        exceptions = self.section("exceptions", ("max_duration", "requires"))
        must_expire = "required; every exception must expire, e.g. P14D" if exceptions is not None else ""
        exception_max = self.duration("exceptions.max_duration", (exceptions or {}).get("max_duration"),
                                      must_expire)
        requires = self.exception_requires((exceptions or {}).get("requires", [*EXCEPTION_REQUIREMENTS]))
        return {"max_duration": format_iso_duration(exception_max) if exception_max else None, "requires": requires}

    def operation_part(self) -> dict[str, Any]:
        """clock, mode, rollout."""
        clock = self.choice("clock", self.field("clock", default="DATABASE"), CLOCKS, "clock")
        mode = self.choice("mode", self.field("mode", default="SHADOW"), MODES, "mode")
        rollout = self.section("rollout", ("percent", "cohort", "low_risk")) or {}
        percent = self.integer("rollout.percent", rollout.get("percent", 100), 0, 100,
                               "an integer from 0 to 100")
        rollout_cohort = self.text("rollout.cohort", rollout.get("cohort", "default"))
        stated = {"percent": percent, "cohort": rollout_cohort}
        low_risk = check_low_risk(self, rollout.get("low_risk"))
        if low_risk is not None:  # only when stated: older documents keep their digest
            stated["low_risk"] = low_risk
        return {"clock": clock, "mode": mode, "rollout": stated}

    def contract_access(self) -> dict[str, str] | None:
        """Contract state → the most access it allows; states left out keep their default."""
        if "contract_access" not in self.top:
            return None
        raw = self.section("contract_access", what="contract state to profile") or {}
        result = dict(DEFAULT_CONTRACT_ACCESS)
        for state, value in raw.items():
            path = f"contract_access.{state}"
            if state not in CONTRACT_STATES:
                self.fault(path, f"unknown contract state; expected {_one_of(CONTRACT_STATES)}"
                           + _hint(state, CONTRACT_STATES))
                continue
            profile = self.choice(path, value, PROFILES, "profile", required="required; a profile")
            if profile == "FULL" and state in ENDED_CONTRACT_STATES:
                self.fault(path, "an ended contract cannot keep FULL access; use REVOKED (export stays "
                           "available through support) or another restrictive profile")
            elif profile:
                result[state] = profile
        return result

    def constant(self, key: str, only: str) -> str | None:
        return self.choice(self.name(key), self.field(key, default=only), (only,), "value")

    def identity(self) -> str | None:
        raw = self.field("policy", required="required; expected name@version, e.g. standard-monthly@6")
        if raw is None:
            return None
        if not isinstance(raw, str) or "@" not in raw:
            self.fault("policy", f"must be name@version, e.g. standard-monthly@6; got {_show(raw)}")
            return None
        name, _, version = raw.partition("@")
        if not IDENTITY_NAME.fullmatch(name):
            self.fault("policy", f"name {name!r} must be lowercase letters, digits and hyphens, "
                       "not starting with a hyphen")
        if not IDENTITY_VERSION.fullmatch(version):
            self.fault("policy", f"version {version!r} must be a positive integer without leading zeros")
        return raw

    def invoice_statuses(self) -> dict[str, str]:
        result = dict(DEFAULT_INVOICE_STATUS_MAPPING)
        raw = self.section("invoice_status_mapping", what="invoice status to BLOCKING or CLOSED") or {}
        for status, value in raw.items():
            path = f"invoice_status_mapping.{status}"
            if status not in INVOICE_STATUSES:
                hint = _hint(status, INVOICE_STATUSES)
                self.fault(path, f"unknown invoice status; expected {_one_of(INVOICE_STATUSES)}{hint}")
                continue
            debt = self.choice(path, value, DEBT, "value", required=f"required; expected {_one_of(DEBT)}")
            if debt == "BLOCKING" and status == "paid":
                self.fault(path, "cannot be BLOCKING: a paid invoice is never debt")
            elif debt:
                result[status] = debt
        return result

    def retries(self) -> tuple[str | None, int | None, list[timedelta] | None]:
        raw = self.field("retry_authority", required=f"required; exactly one of {_one_of(RETRY_AUTHORITIES)}")
        path, attempts_path = self.name("retry_authority"), self.name("max_attempts")
        authority = None
        if isinstance(raw, list) and len(raw) > 1:
            shown = ", ".join(str(v) for v in raw)
            self.fault(path, f"more than one retry authority given ({shown}); a policy has exactly one")
        elif isinstance(raw, list):
            self.fault(path, f"must be a single value ({_one_of(RETRY_AUTHORITIES)}), not a list")
        else:
            authority = self.choice(path, raw, RETRY_AUTHORITIES, "retry authority")
        attempts = self.integer(attempts_path, self.field("max_attempts", required="required"), 1, None,
                                "a positive integer")
        raw_intervals = self.field("retry_intervals", default=[])
        if authority == "PAYMENT_PROVIDER" and raw_intervals:
            self.fault("retry_intervals", "PROVIDER schedules are evidence; retry_intervals is LOCAL only")
            return authority, attempts, []
        intervals = self.items("retry_intervals", raw_intervals, "durations", self.duration)
        if authority == "LOCAL" and intervals == [] and "retry_intervals" not in self.bad:
            self.fault("retry_intervals", "required when retryAuthority is LOCAL, e.g. [PT15M, PT6H, P1D]")
        if authority == "LOCAL" and intervals and attempts and len(intervals) > attempts - 1:
            self.fault("retry_intervals", f"{len(intervals)} intervals but {attempts_path} {attempts} allows "
                       f"at most {attempts - 1} retries after the first attempt")
        return authority, attempts, intervals

    def failure_classes(self) -> dict[str, str]:
        result: dict[str, str] = {}
        raw = self.section("failure_classes", what="decline code to failure class") or {}
        for code, value in raw.items():
            path = f"failure_classes.{code}"
            failure_class = self.choice(path, value, FAILURE_CLASSES, "failure class",
                                        required=f"required; expected {_one_of(FAILURE_CLASSES)}")
            if not isinstance(code, str) or not code.strip():
                self.fault(path, "a decline code must be a non-empty string")
            elif code.strip().lower() in result:
                self.fault(path, "given twice (decline codes are compared case-insensitively)")
            elif code.strip().lower() in HARD_DECLINES and failure_class and failure_class not in NO_RETRY:
                self.fault(path, f"{code} is a hard decline and is never retried; map it to CUSTOMER_ACTION or "
                                 "NON_RETRYABLE")
            elif failure_class:
                result[code.strip().lower()] = failure_class
        return result

    def grace(self, restricted: str | None) -> tuple[str | None, timedelta | None, str | None]:
        """(starts, duration, profile); a NO_GRACE policy has no duration and defaults to ``restricted``."""
        shape = "NO_GRACE or a mapping with starts, duration and profile"
        raw = self.field("grace", required=f"required; {shape}")
        if raw == "NO_GRACE":
            return "NO_GRACE", None, restricted
        if raw is not None and not isinstance(raw, dict):
            self.fault("grace", f"must be {shape}; got {_show(raw)}")
        grace = self.section("grace", ("starts", "duration", "profile")) if isinstance(raw, dict) else None
        if grace is None:
            return None, None, None
        starts = grace.get("starts", "FIRST_FAILURE")
        starts = self.choice("grace.starts", starts, GRACE_STARTS, "grace start")
        profile = self.choice("grace.profile", grace.get("profile"), PROFILES, "profile")
        if starts == "NO_GRACE":
            if "duration" in grace:
                self.fault("grace.duration", "not allowed when grace is NO_GRACE")
            return starts, None, profile or restricted
        duration = self.duration("grace.duration", grace.get("duration"),
                                 "required unless grace is NO_GRACE" if starts else "")
        if starts and "profile" not in grace:
            self.fault("grace.profile", f"required; the profile during grace, one of {_one_of(PROFILES)}")
        return starts, duration, profile

    def check_reminders(self, reminders: list[Any] | None, starts: str | None, duration: Any) -> None:
        if reminders and starts == "NO_GRACE":
            self.fault(REMINDERS_FIELD, "not allowed when grace is NO_GRACE: there is no grace end to "
                       "remind before")
        for i, reminder in enumerate(reminders or []):
            if starts == "FIRST_FAILURE" and duration and reminder >= duration:
                self.fault(f"{REMINDERS_FIELD}[{i}]", f"reminder {format_iso_duration(reminder)} before grace end "
                           "falls at or before grace starts; it must be shorter than the grace duration "
                           f"{format_iso_duration(duration)}")

    def cancellation(self) -> tuple[str | None, timedelta | None]:
        path = self.name("cancel_after")
        cancel_after = self.field("cancel_after", default="MANUAL_ONLY")
        cancel_after = self.choice(path, cancel_after, CANCEL_AFTER, "value")
        delay = self.duration("cancel_after_restricted", self.field("cancel_after_restricted"))
        present = "cancel_after_restricted" in self.top
        if cancel_after == "MANUAL_OR_POLICY_TERMINAL" and not present:
            self.fault("cancel_after_restricted", f"required when {path} is MANUAL_OR_POLICY_TERMINAL, "
                       "e.g. P30D")
        elif cancel_after == "MANUAL_ONLY" and present:
            self.fault("cancel_after_restricted", f"not allowed when {path} is MANUAL_ONLY (the default); "
                       f"set {path}: MANUAL_OR_POLICY_TERMINAL to cancel after this delay")
        return cancel_after, delay

    def exception_requires(self, value: Any) -> list[str] | None:
        items = self.items("exceptions.requires", value, "requirements", self.text)
        for item in items or []:
            if item not in EXCEPTION_REQUIREMENTS:
                self.fault("exceptions.requires", f"unknown requirement {item!r}; only owner, reason "
                           "and ticket")
        missing = [r for r in EXCEPTION_REQUIREMENTS if items is not None and r not in items]
        if missing:
            self.fault("exceptions.requires", "must include owner, reason and ticket; missing "
                       + ", ".join(missing))
        return [*EXCEPTION_REQUIREMENTS] if items is not None else None
