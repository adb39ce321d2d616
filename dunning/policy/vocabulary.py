"""The vocabulary of `subscription.dunningPolicy.v1` (SPEC §4): allowed values, defaults,
Stripe's hard declines and the key spellings the parser accepts. Pure data."""

from __future__ import annotations

import re

SCHEMA_ID = "subscription.dunningPolicy.v1"
PROFILES = ("FULL", "LIMITED", "READ_EXPORT_NO_NEW_JOBS", "SUSPENDED", "REVOKED")
FAILURE_CLASSES = ("RETRYABLE", "TRANSIENT_UNKNOWN", "CUSTOMER_ACTION", "NON_RETRYABLE")
INVOICE_STATUSES = ("draft", "open", "paid", "void", "uncollectible")
DEBT = ("BLOCKING", "CLOSED")
RETRY_AUTHORITIES = ("PAYMENT_PROVIDER", "LOCAL")
GRACE_STARTS = ("FIRST_FAILURE", "NO_GRACE")
CANCEL_AFTER = ("MANUAL_OR_POLICY_TERMINAL", "MANUAL_ONLY")
CLOCKS = ("DATABASE", "APPLICATION")
MODES = ("SHADOW", "NOTIFY_ONLY", "ENFORCE")
EXCEPTION_REQUIREMENTS = ("owner", "reason", "ticket")
DEFAULT_INVOICE_STATUS_MAPPING = {
    "draft": "CLOSED", "open": "BLOCKING", "paid": "CLOSED", "void": "CLOSED", "uncollectible": "BLOCKING",
}
# Stripe's hard declines: never retried, whatever a policy says; the customer must act.
HARD_DECLINES = {
    "incorrect_number": "NON_RETRYABLE", "lost_card": "NON_RETRYABLE", "pickup_card": "NON_RETRYABLE",
    "stolen_card": "NON_RETRYABLE", "revocation_of_authorization": "NON_RETRYABLE",
    "revocation_of_all_authorizations": "NON_RETRYABLE", "authentication_required": "CUSTOMER_ACTION",
    "highest_risk_level": "NON_RETRYABLE",
}
NO_RETRY = ("CUSTOMER_ACTION", "NON_RETRYABLE")
# SPEC §8 classification, consulted after the policy's own failure_classes.
BUILTIN_FAILURE_CLASSES = {
    **HARD_DECLINES, "timeout": "TRANSIENT_UNKNOWN", "api_error": "TRANSIENT_UNKNOWN",
    "insufficient_funds": "RETRYABLE", "processing_error": "RETRYABLE",
    "authentication_required": "CUSTOMER_ACTION", "expired_card": "CUSTOMER_ACTION",
    "lost_card": "NON_RETRYABLE", "stolen_card": "NON_RETRYABLE", "fraudulent": "NON_RETRYABLE",
    "revocation_of_authorization": "NON_RETRYABLE", "revocation_of_all_authorizations": "NON_RETRYABLE",
}

CAMEL_CASE_KEYS = {
    "retry_authority": "retryAuthority", "max_attempts": "maxAttempts", "restrict_after": "restrictAfter",
    "recover_on": "recoverOn", "cancel_after": "cancelAfter",
}
SNAKE_CASE_KEYS = {camel: snake for snake, camel in CAMEL_CASE_KEYS.items()}
TOP_LEVEL_KEYS = (
    "schema", "policy", "default", "provider", "applies_to", "invoice_status_mapping", "dispute_lost",
    "retry_authority", "max_attempts", "retry_intervals", "failure_classes", "grace", "restrict_after",
    "restricted_profile", "recover_on", "recover_with_remaining_debt", "cancel_after",
    "cancel_after_restricted", "notifications", "exceptions", "clock", "mode", "rollout", "contract_access",
)
ACCEPTED_KEYS = TOP_LEVEL_KEYS + tuple(CAMEL_CASE_KEYS.values())
IDENTITY_NAME = re.compile(r"[a-z0-9][a-z0-9-]*")
IDENTITY_VERSION = re.compile(r"[1-9][0-9]*")
REMINDERS_FIELD = "notifications.reminders_before_grace_end"
# What each contract state (the provider subscription's status; an ended contract reads
# `canceled`) allows at most. Debt may restrict further; the contract never loosens it.
# `past_due` and `unpaid` are FULL here because the debt line (the cycles) decides those.
CONTRACT_STATES = ("trialing", "active", "past_due", "unpaid", "paused", "canceled", "incomplete",
                   "incomplete_expired")
ENDED_CONTRACT_STATES = ("canceled", "incomplete_expired")
DEFAULT_CONTRACT_ACCESS = {
    "trialing": "FULL", "active": "FULL", "past_due": "FULL", "unpaid": "FULL",
    "paused": "READ_EXPORT_NO_NEW_JOBS", "canceled": "REVOKED", "incomplete": "LIMITED",
    "incomplete_expired": "REVOKED",
}
