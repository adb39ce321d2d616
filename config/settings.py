"""Settings read from the environment (SPEC §13a).

With nothing set, the product runs on embedded defaults: SQLite in ./var and Celery tasks
executed in process, so `bin/demo` needs nothing but Python.
"""

import os
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("DUNNING_VAR_DIR", BASE_DIR / "var"))


def _env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


DEBUG = _env_bool("DJANGO_DEBUG", False)
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "")
if not SECRET_KEY:
    # Embedded default only: a fixed development key is harmless because without
    # DJANGO_SECRET_KEY the product also runs on SQLite with demo data.
    SECRET_KEY = "dev-only-insecure-key-set-DJANGO_SECRET_KEY-in-production"
ALLOWED_HOSTS = [h.strip() for h in os.environ.get("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",")]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "simple_history",
    "subscriptions",
    "dunning",
    "entitlements",
    "agentpay",
]

# The verification package (tests/verification/: the Stripe-compatible simulator, the seeded
# simulation, the demo data set and their `simulate` / `load_demo` commands) lives with the tests.
# A checkout has it and installs it; an installed product (pyproject's packages) does not.
if (BASE_DIR / "tests" / "verification" / "apps.py").is_file():
    INSTALLED_APPS.append("tests.verification")

MIDDLEWARE = [
    # First: the provider webhook (/webhooks/<provider>/) goes straight to its view; it needs none of
    # what follows (dunning/web/webhooks.py). Every other request passes on through the whole chain.
    "dunning.web.webhooks.WebhookRoute",
    # Then: every AgentPay request is recorded with its request_id before anything may refuse it.
    "agentpay.api.request_log.GatewayRequestLog",
    # Then: a priced call skips the session, CSRF, auth, messages and history middleware (agentpay/api/priced_route.py).
    "agentpay.api.priced_route.PricedCallRoute",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "simple_history.middleware.HistoryRequestMiddleware",
]

ROOT_URLCONF = "config.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]
WSGI_APPLICATION = "config.wsgi.application"

_default_sqlite = f"sqlite:///{VAR_DIR / 'db.sqlite3'}"
# DB_CONN_MAX_AGE: seconds a web/worker process keeps its connection. Opening a PostgreSQL
# connection per request (0) costs the webhook its latency target in bench/.
DATABASES = {"default": dj_database_url.parse(os.environ.get("DATABASE_URL") or _default_sqlite,
                                              conn_max_age=int(os.environ.get("DB_CONN_MAX_AGE", "60")),
                                              conn_health_checks=True)}
DATABASES["default"]["ATOMIC_REQUESTS"] = False  # writes choose their own durable transaction
# PostgreSQL: server-side binding + prepared statements. Every hot path (grace sweep, paid event,
# 402, wallet call) is bound by per-statement cost, much of it PostgreSQL planning the same few
# dozen query shapes again and again; Django's default (psycopg's ClientCursor, values spliced into
# the text) can never prepare. With server-side binding psycopg sends the parameters apart and
# prepares a query on its DB_PREPARE_THRESHOLD-th execution on a connection (Django's default of
# None never prepares). Prepared statements live per connection: they pay with DB_CONN_MAX_AGE > 0
# and break behind a transaction-mode pooler (pgbouncer < 1.21). SQLite is untouched.
# On by default (DB_SERVER_SIDE_BINDING=0 turns it off). Django types an int it cannot place (an
# IntegerField, or `F(total) + amount`'s amount) as psycopg's Int4, and psycopg's binary dumper
# would wrap an Int4 past 2**31 silently; dunning.psycopg_ints (registered in DunningConfig.ready)
# widens such a value instead, so it arrives exact or PostgreSQL refuses it, as a client-side
# literal would (tests/test_prepared_statements.py).
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql" and _env_bool("DB_SERVER_SIDE_BINDING", True):
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        server_side_binding=True, prepare_threshold=int(os.environ.get("DB_PREPARE_THRESHOLD", "5")))
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"

# Celery: Redis when REDIS_URL is set; otherwise tasks run in process (embedded default).
REDIS_URL = os.environ.get("REDIS_URL", "")
CELERY_BROKER_URL = REDIS_URL or "memory://"
CELERY_RESULT_BACKEND = None
CELERY_TASK_ALWAYS_EAGER = not REDIS_URL
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TIMEZONE = "UTC"

# Stripe (SPEC §8, §13a). STRIPE_API_BASE points the official SDK at a local
# Stripe-compatible server in tests and the demo.
STRIPE_API_KEY = os.environ.get("STRIPE_API_KEY", "sk_test_local")
STRIPE_API_BASE = os.environ.get("STRIPE_API_BASE", "https://api.stripe.com")
STRIPE_WEBHOOK_SECRET = os.environ.get("STRIPE_WEBHOOK_SECRET", "whsec_local")
# While a secret is rolled, STRIPE_WEBHOOK_SECRETS lists the old and new ones (comma separated).
STRIPE_WEBHOOK_SECRETS = [
    s.strip() for s in os.environ.get("STRIPE_WEBHOOK_SECRETS", STRIPE_WEBHOOK_SECRET).split(",") if s.strip()
]
STRIPE_ACCOUNT = os.environ.get("STRIPE_ACCOUNT", "acct_demo")
STRIPE_API_VERSION = os.environ.get("STRIPE_API_VERSION", "")  # empty: the SDK's pinned version
STRIPE_TIMEOUT_SECONDS = float(os.environ.get("STRIPE_TIMEOUT_SECONDS", "10"))
# How long one Stripe call keeps trying through HTTP 429 (rate limited): Retry-After when Stripe sends
# it, else exponential back-off with jitter from 0.25 s up to 2 s. Past it the call is indeterminate
# and says so (an event stays pending with that reason, a job notes it). 0: never wait.
STRIPE_RATE_LIMIT_RETRY_SECONDS = float(os.environ.get("STRIPE_RATE_LIMIT_RETRY_SECONDS", "5"))
# Stripe requests a second from this process, shared by its threads (subscriptions/providers/pacing.py):
# the account's limit divided by the processes calling Stripe at once (live 100/s, test 25/s). 0:
# unpaced, the 429 back-off alone, which is enough while few requests are in flight.
STRIPE_MAX_REQUESTS_PER_SECOND = float(os.environ.get("STRIPE_MAX_REQUESTS_PER_SECOND", "0"))
# Alipay recurring deduction (seed 003, issue 20; subscriptions/providers/alipay/, docs/alipay.md).
# ALIPAY_GATEWAY_URL points the SDK at a local Alipay-compatible server in tests and the demo. Keys
# are PEM text (or a path to a PEM file): ours signs requests, Alipay's verifies answers and
# notifications. Without an app id the adapter is configured but refuses every call.
ALIPAY_APP_ID = os.environ.get("ALIPAY_APP_ID", "")
ALIPAY_GATEWAY_URL = os.environ.get("ALIPAY_GATEWAY_URL", "https://openapi.alipay.com/gateway.do")
ALIPAY_APP_PRIVATE_KEY = os.environ.get("ALIPAY_APP_PRIVATE_KEY", "")
ALIPAY_PUBLIC_KEY = os.environ.get("ALIPAY_PUBLIC_KEY", "")
ALIPAY_NOTIFY_URL = os.environ.get("ALIPAY_NOTIFY_URL", "")  # empty: SITE_URL + /webhooks/alipay/
ALIPAY_TIMEOUT_SECONDS = float(os.environ.get("ALIPAY_TIMEOUT_SECONDS", "10"))
# The plans collected through Alipay: Alipay holds no prices, the merchant does. Amounts in fen.
ALIPAY_PLANS = {
    "alipay_monthly": {"name": "Pro (monthly, Alipay)", "amount": 3000, "currency": "cny", "interval": "month"},
    "alipay_annual": {"name": "Pro (annual, Alipay)", "amount": 30000, "currency": "cny", "interval": "year"},
}
WEBHOOK_MAX_BODY_BYTES = int(os.environ.get("WEBHOOK_MAX_BODY_BYTES", str(512 * 1024)))
# Stored provider bodies are desensitised (dunning/privacy.py, docs/privacy.md). The hash key keeps
# hashed emails and card fingerprints comparable; set it explicitly in production (changing it, or
# DJANGO_SECRET_KEY when it is unset, makes new hashes differ from stored ones).
PRIVACY_HASH_KEY = os.environ.get("PRIVACY_HASH_KEY", "") or f"privacy-hash:{SECRET_KEY}"
RAW_BODY_RETENTION_DAYS = int(os.environ.get("RAW_BODY_RETENTION_DAYS", "90"))

EMAIL_BACKEND = os.environ.get("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "billing@example.com")

# Scheduled operations (SPEC §10). Times in seconds.
# One clock for every policy (APPLICATION or DATABASE) instead of each policy's `clock`; empty: the policy's.
DUNNING_CLOCK_OVERRIDE = os.environ.get("DUNNING_CLOCK_OVERRIDE", "")
DUNNING_FRESH_RECEIPT_MAX_AGE_SECONDS = int(os.environ.get("DUNNING_FRESH_RECEIPT_MAX_AGE_SECONDS", "300"))
DUNNING_PUBLIC_BASE_URL = os.environ.get("DUNNING_PUBLIC_BASE_URL", "http://localhost:8000")
DUNNING_SUPPORT_EMAIL = os.environ.get("DUNNING_SUPPORT_EMAIL", "support@example.com")
# Who owns unknown payments: one queue user, else members of these groups in turn.
DUNNING_UNKNOWN_PAYMENT_QUEUE_USER = os.environ.get("DUNNING_UNKNOWN_PAYMENT_QUEUE_USER", "")
DUNNING_UNKNOWN_OWNER_GROUPS = ("Billing leads", "Support agents")
DUNNING_INBOX_STALE_SECONDS = 60
DUNNING_DISPATCH_STALE_SECONDS = 120
DUNNING_PROVIDER_RETRY_OVERDUE_SECONDS = 3600
# Rows a sweeping job (grace expiry, restriction, cancellation) works on at once in one worker, each
# on its own thread and database connection, so the fresh fetches' provider latency overlaps
# (dunning/jobs/row_pool.py); 1 is the sequential sweep. 8: Little's law at Stripe's live limit,
# 100 reads/s × 0.15 s ≈ 15 fetches in flight, is 8 in each of two workers; 9 connections a worker.
DUNNING_PROVIDER_IO_THREADS = int(os.environ.get("DUNNING_PROVIDER_IO_THREADS", "16"))
DUNNING_PROVIDER_CANCEL_ALERT_SECONDS = 3600  # a provider cancellation unconfirmed this long raises an alert
# Alerts and reconciliation.
DUNNING_ALERT_PAID_NOT_RESTORED_SECONDS = 60
DUNNING_ALERT_LOOKBACK_DAYS = 7
DUNNING_FAILURE_SPIKE_FACTOR = float(os.environ.get("DUNNING_FAILURE_SPIKE_FACTOR", "2.0"))
DUNNING_FAILURE_SPIKE_MIN_ATTEMPTS = 20
DUNNING_FAILURE_SPIKE_MIN_RATE = 0.05  # a perfect week must not page on one failure
DUNNING_RECONCILIATION_WINDOW_HOURS = 24
DUNNING_RECONCILIATION_MAX_CATCH_UP_DAYS = 7
DUNNING_RECONCILIATION_EVENT_GRACE_SECONDS = 300
DUNNING_RECONCILIATION_EVENT_PREFIXES = ("invoice.", "payment_intent.", "charge.", "customer.subscription.")
# Inbox sweep (dunning/jobs/inbox.py): an event that never finished an attempt and that no live
# worker holds (its PostgreSQL advisory lock dies with the worker's connection) is orphaned after
# this many seconds (a worker killed mid-task; a task the broker hands out again only after its
# visibility timeout) and is processed by the sweep. DUNNING_INBOX_STALE_SECONDS still applies to
# events already attempted (retrying with back-off, FAILED).
DUNNING_INBOX_ORPHAN_SECONDS = int(os.environ.get("DUNNING_INBOX_ORPHAN_SECONDS", "5"))
# A request whose URL or session cookie carries a NUL gets a 400 before any view queries
# PostgreSQL, which cannot hold NUL in text; an admin id no primary key can hold gets a 404
# (dunning/web/input_guards.py).
MIDDLEWARE = [*MIDDLEWARE, "dunning.web.input_guards.HostileInputGuard"]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "WARNING")},
}

# Settings of the REST API (SPEC §13) and of the support console / customer pages (SPEC §11,
# §12) live beside this file, one module each.
from config.settings_agentpay import *  # noqa: E402, F403
from config.settings_alerting import *  # noqa: E402, F403
from config.settings_api import *  # noqa: E402, F403
from config.settings_console import *  # noqa: E402, F403
