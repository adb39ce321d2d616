"""Issuing and revoking service tokens. The token is returned once; only its digest is stored."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from datetime import datetime

from dunning.clock import trusted_now
from entitlements.api.auth import SCOPE_ENTITLEMENTS_READ, TOKEN_PREFIX, TOKEN_SCOPES, token_digest
from entitlements.models import ServiceToken


class TokenError(ValueError):
    """Bad input for a service token (unknown scope, duplicate name)."""


def service_token_create(*, name: str, scopes: Sequence[str] = (SCOPE_ENTITLEMENTS_READ,),
                         provider_account: str = "", cohort: str = "",
                         now: datetime | None = None) -> tuple[ServiceToken, str]:
    """Create a token; returns (row, raw token). The raw token is never stored or shown again."""
    name = name.strip()
    if not name:
        raise TokenError("a service token needs a name")
    unknown = sorted(set(scopes) - set(TOKEN_SCOPES))
    if unknown:
        raise TokenError(f"unknown scope(s) {', '.join(unknown)}; known: {', '.join(TOKEN_SCOPES)}")
    if ServiceToken.objects.filter(name=name).exists():
        raise TokenError(f"a service token named {name!r} already exists")
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ServiceToken.objects.create(
        name=name, prefix=raw[:12], token_hash=token_digest(raw), scopes=sorted(set(scopes)),
        provider_account=provider_account.strip(), cohort=cohort.strip(), created_at=now or trusted_now(),
    )
    return token, raw


def service_token_revoke(*, token: ServiceToken, now: datetime | None = None) -> bool:
    """Revoke once; returns False if it was already revoked."""
    return ServiceToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
        revoked_at=now or trusted_now()) == 1
