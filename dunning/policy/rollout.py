"""Policy modes and rollout (SPEC §15): whether a decision may change access or send messages."""

from __future__ import annotations

import hashlib

from dunning.policy.document import PolicyDocument


def rollout_bucket(subscription_key: str, cohort: str) -> int:
    """Deterministic 0..99 bucket per subscription, so a rollout percentage is stable."""
    digest = hashlib.sha256(f"{cohort}:{subscription_key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % 100


def in_rollout(spec: PolicyDocument, *, subscription_key: str, cohort: str) -> bool:
    if spec.rollout_cohort not in ("*", cohort):
        return False
    return rollout_bucket(subscription_key, cohort) < spec.rollout_percent


def enforces_access(spec: PolicyDocument, *, subscription_key: str, cohort: str) -> bool:
    return spec.mode == "ENFORCE" and in_rollout(spec, subscription_key=subscription_key, cohort=cohort)


def sends_notifications(spec: PolicyDocument, *, subscription_key: str, cohort: str) -> bool:
    if spec.mode == "SHADOW":
        return False
    return in_rollout(spec, subscription_key=subscription_key, cohort=cohort)
