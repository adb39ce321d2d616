"""Who is calling, and what they may do (SPEC §13).

Two kinds of principal:

- a runtime service with a `ServiceToken` (``Authorization: Bearer dsvc_…``). Its scopes are
  read-only: ``entitlements:read`` (the entitlement endpoint) and ``billing:read`` (subscription,
  cycles, transitions, policies). A token restricted to a provider account or cohort sees
  nothing outside it (404). A token can never write: writes need a person to name in the audit.
  The one exception is ``usage:write``: a producer reporting usage it metered (issue 19) states a
  consumption fact about itself, not a staff decision, and the token is the producer named on it.
- a staff member with a session (CSRF enforced by DRF's SessionAuthentication) and the custom
  permissions on `ServiceToken` (granted to "Support agents" and "Billing leads").
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.settings import api_settings
from rest_framework.throttling import ScopedRateThrottle

from dunning.clock import trusted_now
from entitlements.models import ServiceToken

TOKEN_PREFIX = "dsvc_"
SCOPE_ENTITLEMENTS_READ = "entitlements:read"
SCOPE_BILLING_READ = "billing:read"
SCOPE_USAGE_WRITE = "usage:write"
TOKEN_SCOPES = (SCOPE_ENTITLEMENTS_READ, SCOPE_BILLING_READ, SCOPE_USAGE_WRITE)

PERM_READ = "entitlements.api_read"
PERM_GRANT_EXCEPTION = "entitlements.api_grant_exception"
PERM_RETRY = "entitlements.api_retry_payment"
PERM_PUBLISH_POLICY = "entitlements.api_publish_policy"


def token_digest(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


@dataclass(frozen=True)
class ServicePrincipal:
    """`request.user` for a token-authenticated request: authenticated, never staff, no perms."""

    token: ServiceToken

    is_authenticated = True
    is_active = True
    is_staff = False
    is_superuser = False

    @property
    def pk(self) -> str:
        return f"token:{self.token.pk}"

    def get_username(self) -> str:
        return f"service:{self.token.name}"

    def has_perm(self, perm: str, obj: Any = None) -> bool:
        return False


def principal_key(request: Request) -> str:
    """A stable name for the caller, used for idempotency records and throttling."""
    user = request.user
    if isinstance(user, ServicePrincipal):
        return user.pk
    return f"user:{user.pk}"


class ServiceTokenAuthentication(BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[ServicePrincipal, ServiceToken] | None:
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != self.keyword.lower().encode():
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("Authorization must be 'Bearer <token>'.")
        try:
            raw = parts[1].decode()
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("The token is not valid.") from None
        token = ServiceToken.objects.filter(token_hash=token_digest(raw)).first()
        # compare_digest only to keep the final check constant-time; the lookup is by digest.
        if token is None or not hmac.compare_digest(token.token_hash, token_digest(raw)) or not token.is_active:
            raise exceptions.AuthenticationFailed("The token is not valid or was revoked.")
        now = trusted_now()
        if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
            ServiceToken.objects.filter(pk=token.pk).update(last_used_at=now)  # at most once a minute
        return ServicePrincipal(token), token

    def authenticate_header(self, request: Request) -> str:
        return f'{self.keyword} realm="api"'


def _is_staff_user(user: Any) -> bool:
    return bool(user and user.is_authenticated and not isinstance(user, ServicePrincipal)
                and user.is_active and user.is_staff)


class _Rule(BasePermission):
    token_scope: str | None = None  # None: tokens are never allowed
    staff_perm: str = PERM_READ
    message = "You do not have permission for this operation."

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        if isinstance(user, ServicePrincipal):
            return self.token_scope is not None and self.token_scope in user.token.scopes
        return _is_staff_user(user) and user.has_perm(self.staff_perm)


class CanReadEntitlements(_Rule):
    token_scope = SCOPE_ENTITLEMENTS_READ


class CanReadBilling(_Rule):
    token_scope = SCOPE_BILLING_READ


class CanGrantException(_Rule):
    staff_perm = PERM_GRANT_EXCEPTION


class CanRetryPayment(_Rule):
    staff_perm = PERM_RETRY


class CanPublishPolicy(_Rule):
    staff_perm = PERM_PUBLISH_POLICY


def restrict_subscriptions(queryset: QuerySet, request: Request, *, prefix: str = "") -> QuerySet:
    """Object-level permission: a restricted token sees only its account / cohort."""
    user = request.user
    if not isinstance(user, ServicePrincipal):
        return queryset
    token = user.token
    if token.provider_account:
        queryset = queryset.filter(**{f"{prefix}provider_account": token.provider_account})
    if token.cohort:
        queryset = queryset.filter(**{f"{prefix}cohort": token.cohort})
    return queryset


class PrincipalScopedThrottle(ScopedRateThrottle):
    """DRF's scoped throttle keyed by principal (token or user), with rates read at request time
    so they follow settings changes (tests relax them)."""

    def get_rate(self) -> str | None:
        rates = api_settings.DEFAULT_THROTTLE_RATES or {}
        if self.scope not in rates:
            raise exceptions.APIException(f"no throttle rate for scope {self.scope!r}")
        return rates[self.scope]

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        user = request.user
        ident = principal_key(request) if user is not None and user.is_authenticated else self.get_ident(request)
        return self.cache_format % {"scope": self.scope, "ident": ident}
