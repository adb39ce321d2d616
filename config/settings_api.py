"""REST API settings (SPEC §13). Imported at the end of config/settings.py.

INSTALLED_APPS needs "drf_spectacular" and "drf_spectacular_sidecar" (added in config/settings.py).
"""

import os

# Requests per principal (service token or staff user) and scope; DRF rate syntax.
API_THROTTLE_RATES = {
    "entitlement_read": os.environ.get("API_RATE_ENTITLEMENT_READ", "6000/min"),
    "billing_read": os.environ.get("API_RATE_BILLING_READ", "600/min"),
    "billing_write": os.environ.get("API_RATE_BILLING_WRITE", "60/min"),
    # Producers report usage as it is metered: many small records, so far above staff writes.
    "usage_write": os.environ.get("API_RATE_USAGE_WRITE", "6000/min"),
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # First: its WWW-Authenticate header is what a 401 carries.
        "entitlements.api.auth.ServiceTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",  # staff; enforces CSRF
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["config.json_depth.DepthLimitedJSONParser"],  # JSONParser with a depth limit
    "DEFAULT_THROTTLE_CLASSES": ["entitlements.api.auth.PrincipalScopedThrottle"],
    "DEFAULT_THROTTLE_RATES": API_THROTTLE_RATES,
    "DEFAULT_PAGINATION_CLASS": "entitlements.api.pagination.NewestFirstCursorPagination",
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "entitlements.api.problems.problem_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Dunning & entitlement grace API",
    "DESCRIPTION": (
        "Entitlements for runtime services (service tokens, scope entitlements:read) and billing "
        "operations for staff (session + CSRF). Errors are RFC 9457 problem documents. "
        "State-changing POSTs require an Idempotency-Key header."
    ),
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "SERVE_AUTHENTICATION": [],
    "COMPONENT_SPLIT_REQUEST": True,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # AgentPay publishes its own schema at /agentpay/v1/schema/.
    "PREPROCESSING_HOOKS": ["agentpay.api.schema.exclude_agentpay"],
}

# Idempotency-Key records are kept this long; a repeat after that runs the service again.
API_IDEMPOTENCY_RETENTION_HOURS = int(os.environ.get("API_IDEMPOTENCY_RETENTION_HOURS", "24"))
# An in-flight claim older than this is taken to belong to a crashed request and may be re-claimed.
API_IDEMPOTENCY_IN_FLIGHT_SECONDS = int(os.environ.get("API_IDEMPOTENCY_IN_FLIGHT_SECONDS", "300"))

# Entitlement push to subscriber URLs (entitlements.push).
ENTITLEMENT_PUSH_TIMEOUT_SECONDS = float(os.environ.get("ENTITLEMENT_PUSH_TIMEOUT_SECONDS", "3"))
ENTITLEMENT_PUSH_MAX_ATTEMPTS = int(os.environ.get("ENTITLEMENT_PUSH_MAX_ATTEMPTS", "12"))
ENTITLEMENT_PUSH_BACKOFF_BASE_SECONDS = int(os.environ.get("ENTITLEMENT_PUSH_BACKOFF_BASE_SECONDS", "30"))
ENTITLEMENT_PUSH_BACKOFF_MAX_SECONDS = int(os.environ.get("ENTITLEMENT_PUSH_BACKOFF_MAX_SECONDS", "3600"))

# API throttle counters live in the default cache. One process needs nothing more; several web
# processes need a shared cache, e.g. CACHE_URL=redis://127.0.0.1:6379/2.
if _cache_url := __import__("os").environ.get("CACHE_URL", ""):
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": _cache_url}}
