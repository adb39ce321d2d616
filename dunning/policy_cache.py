"""Validated policy documents, cached per published row (published policies never change)."""

from __future__ import annotations

from functools import lru_cache

from dunning.policy_document import PolicyDocument, validate_policy


@lru_cache(maxsize=256)
def _spec_for(policy_id: int, digest: str, document_json: str) -> PolicyDocument:
    import json

    return validate_policy(json.loads(document_json))


def policy_spec(policy) -> PolicyDocument:  # noqa: ANN001 - DunningPolicy; avoid import cycle
    import json

    return _spec_for(policy.pk, policy.digest, json.dumps(policy.document, sort_keys=True))
