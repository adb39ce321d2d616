"""drf-spectacular extension: describe service-token auth as an HTTP bearer scheme."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ServiceTokenScheme(OpenApiAuthenticationExtension):
    target_class = "entitlements.api.auth.ServiceTokenAuthentication"
    name = "serviceToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {"type": "http", "scheme": "bearer",
                "description": "A service token from `manage.py create_service_token NAME` (dsvc_…)."}
