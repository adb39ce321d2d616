"""Validated policy documents, cached per published row.

Published policies are append-only, so a row's (pk, digest) names one document for good. The
cache is consulted before the document is touched: hot paths load policies with the heavy
columns deferred (``POLICY_DEFERRED``) and only a cache miss reads and validates the JSON.
"""

from __future__ import annotations

import copy
import threading
from functools import cache

from dunning.models import DunningPolicy
from dunning.policy.document import PolicyDocument, validate_policy

# Columns a hot path never needs once the document is cached (select_related("policy") + defer).
POLICY_DEFERRED = ("document", "source_text")

_SPECS: dict[tuple[int, str], PolicyDocument] = {}
_MAX_CACHED = 256
# Threads share the cache (a sweep's provider-I/O threads, `celery worker -P threads`): a hit is one
# dict read; a miss validates outside the lock (a document is immutable, a second validation of the
# same key only wastes time) and stores under it, so the size check and the store stay together.
_SPECS_LOCK = threading.Lock()


def policy_spec(policy) -> PolicyDocument:  # noqa: ANN001 - DunningPolicy; avoid import cycle
    key = (policy.pk, policy.digest)
    spec = _SPECS.get(key)
    if spec is None:
        spec = validate_policy(copy.deepcopy(policy.document))
        with _SPECS_LOCK:
            if len(_SPECS) >= _MAX_CACHED:
                _SPECS.clear()
            spec = _SPECS.setdefault(key, spec)
    return spec


def deferred_policy(relation: str) -> tuple[str, ...]:
    """``defer()`` arguments for the heavy policy columns reached through ``relation``."""
    return tuple(f"{relation}__{name}" for name in POLICY_DEFERRED)


@cache
def spec_only_policy(relation: str) -> tuple[str, ...]:
    """``defer()`` arguments leaving only what `policy_spec` reads on a cache hit (pk and digest),
    for the acceptance transaction's own reads: every column is compile and load time there.
    Anything else is still loaded on access, one query at a time."""
    return tuple(f"{relation}__{f.attname}" for f in DunningPolicy._meta.concrete_fields
                 if f.attname not in ("id", "digest"))
