"""Tenants authenticate with API keys (`Authorization: Bearer ak_…`), stored as SHA-256 digests."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from agentpay import ids
from agentpay.api.front import front_read
from agentpay.bridge import trusted_now
from agentpay.models import Tenant, TenantApiKey


def key_digest(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()


def tenant_api_key_create(*, tenant: Tenant, label: str = "") -> tuple[TenantApiKey, str]:
    """A new key for `tenant`; the raw key is returned once and never stored."""
    raw = ids.new_api_key()
    with transaction.atomic():
        key = TenantApiKey.objects.create(tenant=tenant, label=label, key_prefix=raw[:10], key_hash=key_digest(raw))
    return key, raw


@dataclass(frozen=True)
class TenantPrincipal:
    """`request.user` for a key-authenticated call: a tenant, never staff."""

    tenant: Tenant
    key: TenantApiKey

    is_authenticated = True
    is_active = True
    is_staff = False
    is_superuser = False

    @property
    def pk(self) -> str:
        return f"tenant:{self.tenant.tenant_id}"

    def get_username(self) -> str:
        return self.pk

    def has_perm(self, perm: str, obj: object = None) -> bool:
        return False


class TenantApiKeyAuthentication(BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[TenantPrincipal, TenantApiKey] | None:
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != b"bearer":
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("Authorization must be 'Bearer ak_…'.")
        try:
            raw = parts[1].decode("ascii")
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("The API key is not valid.") from None
        # A view that names a priced route in its URL (`reads_route`) has it read with the key: one
        # statement (agentpay.api.front), the route left on the request for the view.
        context = request.parser_context or {}
        slug = context.get("kwargs", {}).get("route") if getattr(context.get("view"), "reads_route", False) else None
        front = front_read(key_digest(raw), slug)
        key = front.key
        if slug is not None:
            request._request.agentpay_front = (slug, front.route, front.wallet)
        if key is None:
            raise exceptions.AuthenticationFailed("The API key is not valid or was revoked.")
        now = trusted_now()
        if key.last_used_at is None or now - key.last_used_at > timedelta(minutes=1):
            TenantApiKey.objects.filter(pk=key.pk).update(last_used_at=now)  # at most once a minute
        request._request.agentpay_tenant = key.tenant  # for the request log
        return TenantPrincipal(key.tenant, key), key

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="agentpay"'


class IsTenant(BasePermission):
    def has_permission(self, request: Request, view: object) -> bool:
        return isinstance(request.user, TenantPrincipal)
