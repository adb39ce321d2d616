"""AgentPay routes, included at /agentpay/ by config/urls.py."""

from django.urls import path
from drf_spectacular.views import SpectacularAPIView

from agentpay.api import schema  # noqa: F401  (registers the API-key scheme extension)
from agentpay.api.topups import WalletTopupView
from agentpay.api.views import IntentDetailView, RouteCallView

app_name = "agentpay"

urlpatterns = [
    path("v1/routes/<str:route>/<path:subpath>", RouteCallView.as_view(), name="route-call"),
    path("v1/routes/<str:route>", RouteCallView.as_view(), name="route-call-root"),
    path("v1/intents/<str:intent_id>", IntentDetailView.as_view(), name="intent-detail"),
    path("v1/wallet/topups", WalletTopupView.as_view(), name="wallet-topup"),
    path("v1/schema/", SpectacularAPIView.as_view(custom_settings={
        "TITLE": "AgentPay gateway API",
        "DESCRIPTION": "Pay-per-call gateway (seed 004): tenants call priced upstream routes with an API key and an "
                       "Idempotency-Key; errors are RFC 9457 problem documents.",
        "VERSION": "1",
        "PREPROCESSING_HOOKS": ["agentpay.api.schema.only_agentpay"],
    }), name="schema"),
]
